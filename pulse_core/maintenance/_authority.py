"""Authority: what each principal may do, granted by a human, read afresh at every check.

A principal ("maintenance", "awareness", "agent", "human:ana") has the permissions granted
to it by `grant-issued` events on the key `authority:<principal>` and not since revoked by a
`grant-revoked` event. Only a human issues or revokes a grant (origin `human` or
`human:<who>`): a grant event written by anything else is ignored by every fold, so neither
an agent, nor imported content, nor a component calling itself "system" can give itself
authority. A deployment may also hold standing grants (a layer's settings in config.json,
written by the operator). Being assigned work grants nothing.

Writers are ranked as well, for the memory they write: a human's word outranks the agent's,
and the agent's outranks a background writer's (the awareness reviewer, maintenance, any
rule or executor). `outranks(a, b)` compares the origins of two events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from pulse_core._errors import InvalidEvent, NotAuthorized
from pulse_core._events import Event, EventDraft, register_kind
from pulse_core.store import EventStore

PERMISSIONS = (
    "read", "search", "project", "maintain", "archive", "retention", "merge", "purge",
    "manage_policy", "manage_trust", "manage_schema", "declassify", "assert_as_actor",
    "elevate_authority",
)
"""Every permission a grant can name (seed 004, section 2)."""

GRANT_KINDS = frozenset({"grant-issued", "grant-revoked"})

HUMAN, AGENT, BACKGROUND = 3, 2, 1
"""Writer ranks: a human (or the operator at the CLI), the agent, anything in the background."""


class Grant(msgspec.Struct, frozen=True):
    """Payload of grant-issued and grant-revoked."""

    principal: str
    permission: str
    reason: str = ""
    channel: str = ""  # how the person who wrote it was authenticated (cli, web, library)

    def __post_init__(self) -> None:
        if self.permission not in PERMISSIONS:
            raise ValueError(f"permission {self.permission!r} is not one of "
                             f"{', '.join(PERMISSIONS)}")
        if not self.principal or self.principal != self.principal.strip():
            raise ValueError(f"principal {self.principal!r} must be a non-empty name")


register_kind("grant-issued", "a human granted a permission; key: authority:<principal>", Grant)
register_kind("grant-revoked", "a human revoked a permission; key: authority:<principal>",
              Grant)


def authority_key(principal: str) -> str:
    """The event key of `principal`'s grants."""
    return f"authority:{principal}"


def rank(origin: str) -> int:
    """How strong a writer `origin` is: HUMAN, AGENT or BACKGROUND."""
    head = origin.partition(":")[0]
    if head in ("human", "cli"):
        return HUMAN
    if head == "agent":
        return AGENT
    return BACKGROUND


def outranks(origin: str, other: str) -> bool:
    """Whether a writer with `origin` is stronger than one with `other`."""
    return rank(origin) > rank(other)


def fold_grants(events: Iterable[Event]) -> dict[str, frozenset[str]]:
    """Each principal's permissions after `events` (grant events written by a non-human
    origin, or not on the key `authority:<principal>` of the principal they name, count for
    nothing)."""
    held: dict[str, set[str]] = {}
    for event in events:
        if event.kind not in GRANT_KINDS or rank(event.origin) != HUMAN:
            continue
        try:
            grant = event.payload(Grant)
        except Exception:  # a malformed grant grants nothing
            continue
        if event.key != authority_key(grant.principal):
            continue  # a grant filed under another principal's key grants nothing
        perms = held.setdefault(grant.principal, set())
        if event.kind == "grant-issued":
            perms.add(grant.permission)
        else:
            perms.discard(grant.permission)
    return {p: frozenset(perms) for p, perms in held.items()}


class Authority:
    """The grants of every principal as the log holds them now, plus standing grants.

    Every `require` reads the principal's grants from the log again, so a revocation takes
    effect at the next check, in the middle of a cycle too.
    """

    def __init__(self, store: EventStore,
                 standing: Mapping[str, Iterable[str]] | None = None) -> None:
        self.store = store
        self.standing = {p: frozenset(perms) for p, perms in (standing or {}).items()}
        for principal, perms in self.standing.items():
            for perm in perms:
                Grant(principal, perm)  # refuse an unknown permission when built

    async def grants(self, principal: str) -> frozenset[str]:
        """What `principal` may do now."""
        return (await self._read(principal))[0]

    async def _read(self, principal: str) -> tuple[frozenset[str], int]:
        """`principal`'s permissions now, and the version of its grants key read."""
        events = await self.store.read(key=authority_key(principal))
        logged = fold_grants(events).get(principal, frozenset())
        version = events[-1].version if events else 0
        return logged | self.standing.get(principal, frozenset()), version

    async def allows(self, principal: str, permission: str) -> bool:
        """Whether `principal` holds `permission` now."""
        return permission in await self.grants(principal)

    async def require(self, principal: str, permission: str, action: str) -> None:
        """Return if `principal` holds `permission`; else NotAuthorized naming the action."""
        await self.check(principal, permission, action)

    async def check(self, principal: str, permission: str, action: str) -> int:
        """`require`, returning the version of `authority:<principal>` the decision read.
        A guarded action appends with that expectation, so a grant revoked between the
        check and the write makes the write conflict (re-read, re-check) instead of land."""
        if permission not in PERMISSIONS:
            raise NotAuthorized(
                principal, permission,
                f"{principal!r} may not {action}: {permission!r} is not a permission any "
                f"grant can name (known: {', '.join(PERMISSIONS)}) — fix the caller")
        held, version = await self._read(principal)
        if permission not in held:
            raise NotAuthorized(
                principal, permission,
                f"{principal!r} may not {action}: it holds no {permission!r} grant — a human "
                f"grants it with Authority.issue({principal!r}, {permission!r}, "
                "origin='human:<who>') or the layer's standing grants")
        return version

    async def issue(self, principal: str, permission: str, *, origin: str,
                    reason: str = "") -> Event:
        """Grant `permission` to `principal`; only a human origin may."""
        return await self._write("grant-issued", principal, permission, origin, reason)

    async def revoke(self, principal: str, permission: str, *, origin: str,
                     reason: str = "") -> Event:
        """Revoke a logged grant; only a human origin may (standing grants stay)."""
        return await self._write("grant-revoked", principal, permission, origin, reason)

    async def _write(self, kind: str, principal: str, permission: str, origin: str,
                     reason: str) -> Event:
        verb = "issue" if kind == "grant-issued" else "revoke"
        if rank(origin) != HUMAN:
            raise NotAuthorized(
                origin, "elevate_authority",
                f"{origin!r} may not {verb} grants: only a human (origin 'human:<who>') "
                "changes authority")
        try:
            body = Grant(principal, permission, reason, self.store.principal.channel)
        except ValueError as exc:
            raise InvalidEvent(f"{kind} for {principal!r}: {exc}") from None
        draft = EventDraft(kind, authority_key(principal), msgspec.to_builtins(body),
                           origin=origin)
        return (await self.store.append([draft])).events[0]
