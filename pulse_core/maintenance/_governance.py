"""Governed control state: the trust policy and the active schema packages.

Two kinds of event steer how everything else is read, so they are protected: a
`trust-policy-set` on `governance:trust` (which sources are trusted, and how much) needs the
writer's principal to hold `manage_trust`; a `schema-activated` on `governance:schema` (a
schema package put in force) needs `manage_schema` (seed 004, sections 31 and 32). The
writers check the grant afresh and append with the grants key's expected version, so a
grant revoked between the check and the write makes the write re-check and be refused.

The fold checks again, event by event, against the grants in force at that point of the
log: a control event appended around the writers (imported, forged, written after a
revocation) changes nothing. Text that says "trust this source" in a memory record, or a
grant carried inside another event's data, has no control-plane effect at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from pulse_core._errors import InvalidEvent
from pulse_core._events import Event, EventDraft, register_kind
from pulse_core.maintenance._activities import retry_once
from pulse_core.maintenance._authority import GRANT_KINDS, Authority, authority_key, fold_grants

TRUST_KEY = "governance:trust"
SCHEMA_KEY = "governance:schema"


class TrustPolicySet(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of trust-policy-set: the whole trust policy now in force (it replaces the
    previous one), and the principal whose `manage_trust` grant allowed it."""

    principal: str
    policy: dict[str, Any]
    reason: str = ""


class SchemaActivated(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of schema-activated: a schema package put in force, and the principal whose
    `manage_schema` grant allowed it."""

    principal: str
    package: str
    reason: str = ""

    def __post_init__(self) -> None:
        if not self.package or self.package != self.package.strip():
            raise ValueError(f"package {self.package!r} must be a non-empty name")


register_kind("trust-policy-set", "the trust policy replaced by a principal holding "
              "manage_trust; key: governance:trust", TrustPolicySet)
register_kind("schema-activated", "a schema package activated by a principal holding "
              "manage_schema; key: governance:schema", SchemaActivated)

PROTECTED: Mapping[str, tuple[str, str]] = {
    "trust-policy-set": (TRUST_KEY, "manage_trust"),
    "schema-activated": (SCHEMA_KEY, "manage_schema"),
}
"""Each protected control-state kind: its key and the permission its writer needs."""


class TrustPolicy(msgspec.Struct, frozen=True):
    """The trust policy in force: what it says, who set it, where in the log."""

    policy: dict[str, Any]
    principal: str
    seq: int
    ts: int


class ActiveSchema(msgspec.Struct, frozen=True):
    """A schema package in force: who activated it, where in the log."""

    package: str
    principal: str
    seq: int
    ts: int


class Governance(msgspec.Struct, frozen=True):
    """The governed control state as the log holds it: the trust policy in force (None:
    none was ever set with the grant), the active schema packages in activation order, and
    the seqs of control events that count for nothing (their principal lacked the grant,
    or the event is on the wrong key or malformed)."""

    trust: TrustPolicy | None = None
    schemas: tuple[ActiveSchema, ...] = ()
    ignored: tuple[int, ...] = ()


async def _write(authority: Authority, principal: str, kind: str, body: msgspec.Struct,
                 *, origin: str, action: str) -> Event:
    key, permission = PROTECTED[kind]

    async def attempt() -> Event:
        version = await authority.check(principal, permission, action)
        draft = EventDraft(kind, key, msgspec.to_builtins(body), origin=origin)
        result = await authority.store.append(
            [draft], expect={authority_key(principal): version})
        return result.events[0]

    return await retry_once(attempt)


async def set_trust_policy(authority: Authority, principal: str, policy: Mapping[str, Any],
                           *, origin: str, reason: str = "") -> Event:
    """Replace the trust policy, as `principal` (who must hold `manage_trust`), writing
    with `origin`; NotAuthorized and nothing appended otherwise."""
    body = TrustPolicySet(principal=principal, policy=dict(policy), reason=reason)
    return await _write(authority, principal, "trust-policy-set", body, origin=origin,
                        action="rewrite the trust policy")


async def activate_schema(authority: Authority, principal: str, package: str, *,
                          origin: str, reason: str = "") -> Event:
    """Activate schema `package`, as `principal` (who must hold `manage_schema`), writing
    with `origin`; NotAuthorized and nothing appended otherwise (InvalidEvent for a blank
    package name)."""
    try:
        body = SchemaActivated(principal=principal, package=package, reason=reason)
    except ValueError as exc:
        raise InvalidEvent(f"schema-activated: {exc}") from None
    return await _write(authority, principal, "schema-activated", body, origin=origin,
                        action=f"activate schema package {package!r}")


def fold_governance(events: Sequence[Event],
                    standing: Mapping[str, frozenset[str]] | None = None) -> Governance:
    """The governed control state after `events` (grant and control events, in seq order):
    each control event counts only if its principal held the permission at that point of
    the log (logged grants before it, or a standing grant)."""
    standing = standing or {}
    grants: list[Event] = []
    trust: TrustPolicy | None = None
    schemas: dict[str, ActiveSchema] = {}
    ignored: list[int] = []
    for event in events:
        if event.kind in GRANT_KINDS:
            grants.append(event)
            continue
        if event.kind not in PROTECTED:
            continue
        key, permission = PROTECTED[event.kind]
        try:
            body: TrustPolicySet | SchemaActivated = (
                event.payload(TrustPolicySet) if event.kind == "trust-policy-set"
                else event.payload(SchemaActivated))
        except Exception:  # malformed control state controls nothing
            ignored.append(event.seq)
            continue
        principal = body.principal
        held = fold_grants(grants).get(principal, frozenset()) | standing.get(
            principal, frozenset())
        if event.key != key or permission not in held:
            ignored.append(event.seq)
        elif isinstance(body, TrustPolicySet):
            trust = TrustPolicy(body.policy, principal, event.seq, event.ts)
        elif body.package not in schemas:
            schemas[body.package] = ActiveSchema(body.package, principal, event.seq, event.ts)
    return Governance(trust, tuple(schemas.values()), tuple(ignored))


async def read_governance(authority: Authority) -> Governance:
    """The governed control state now (grants read from `authority`'s store, standing
    grants from `authority`)."""
    events = await authority.store.read(kinds=[*sorted(GRANT_KINDS), *PROTECTED])
    return fold_governance(events, authority.standing)
