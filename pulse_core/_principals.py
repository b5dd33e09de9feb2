"""Principals: who holds a store handle, given by the channel that opened it.

An event's origin is a label its writer chooses; a principal is not. Each EventStore handle
carries one, and an append whose origin the principal may not write is refused. So an origin
that ranks as a person's (`human`, `human:<who>`, `cli`) was written by a human principal, and
authority may rest on it.

    human    the owner: `upulse` run by a person (channel cli), the web UI holding its token
             (channel web), a program that opens the home's files itself (channel library);
             writes any origin
    engine   the engine's executors, the business code of the engine directory among them;
             writes any origin but a person's
    agent    an agent's channel (the Hermes plugin, the MCP server): writes only `agent` and
             `agent:<name>` (or `agent:<name>-…`, `agent:<name>:…`)
"""

from __future__ import annotations

from typing import Literal

import msgspec

from pulse_core._errors import AppendRejected, NotAuthorized
from pulse_core._events import EventDraft, register_kind

__all__ = ["HUMAN_HEADS", "PERSON_KINDS", "WRITE_REFUSED", "Principal", "PrincipalRefused",
           "human_origin", "refusal_draft"]

PrincipalKind = Literal["human", "engine", "agent"]

HUMAN_HEADS = frozenset({"human", "cli"})
"""The origin heads that say a person wrote an event."""

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def human_origin(origin: str) -> bool:
    """Whether `origin` says a person wrote the event (`human`, `human:<who>`, `cli`...)."""
    return origin.partition(":")[0] in HUMAN_HEADS


PERSON_KINDS = frozenset({
    "grant-issued", "grant-revoked",          # authority (pulse_core.maintenance)
    "legal-hold-released", "element-purged",  # retention (pulse_core.maintenance)
    "record-quarantined",                     # memory (pulse_core.memory)
})
"""The kinds only a person's handle may append, whatever their origin says (PostgreSQL's
principals trigger refuses the same kinds)."""


class PrincipalRefused(AppendRejected):
    """A store handle's principal may not write a draft: its origin (an agent's channel
    labelling an event as a person's, say) or its kind (a grant, from anyone but a person);
    nothing of the append was written."""

    def __init__(self, principal: Principal, kind: str, origin: str) -> None:
        self.principal = principal
        self.kind = kind
        self.origin = origin
        what = (f"an event of kind {kind!r}: only a person does, through `upulse` or the web UI"
                if kind in PERSON_KINDS and not principal.is_human
                else f"origin {origin!r}: {principal.may()}")
        super().__init__(f"{principal} may not write {what}")


class Principal(msgspec.Struct, frozen=True):
    """Who holds a store handle: a `kind` (human, engine or agent), a `name` (the agent's
    name; for a person, who, when known) and the `channel` that opened the handle."""

    kind: PrincipalKind
    name: str = ""
    channel: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("human", "engine", "agent"):
            raise ValueError(f"principal kind {self.kind!r}: give human, engine or agent")
        for field, value in (("name", self.name), ("channel", self.channel)):
            if not set(value) <= _NAME_CHARS or len(value) > 64:
                raise ValueError(f"principal {field} {value!r}: up to 64 of a-z, 0-9, -, _, .")
        if self.kind == "agent" and not self.name:
            raise ValueError("an agent principal needs the agent's name")

    @classmethod
    def human(cls, channel: str = "library", name: str = "") -> Principal:
        """A person, authenticated by `channel` (cli, web, library)."""
        return cls("human", name, channel)

    @classmethod
    def engine(cls) -> Principal:
        """The engine's executors."""
        return cls("engine", "", "engine")

    @classmethod
    def agent(cls, name: str, channel: str) -> Principal:
        """Agent `name`, through `channel` (hermes-plugin, mcp...)."""
        return cls("agent", name, channel)

    @property
    def is_human(self) -> bool:
        """Whether a person holds the handle."""
        return self.kind == "human"

    def allows(self, kind: str, origin: str) -> bool:
        """Whether this principal may write an event of `kind` with `origin`."""
        if self.kind == "human":
            return True
        if kind in PERSON_KINDS:
            return False
        if self.kind == "engine":
            return not human_origin(origin)
        name = f"agent:{self.name}"
        return origin in ("agent", name) or origin.startswith((f"{name}-", f"{name}:"))

    def may(self) -> str:
        """What this principal may write, and who may write the rest."""
        if self.kind == "engine":
            return ("the engine writes any origin but a person's (human, human:<who>, cli) — "
                    "a person acts through `upulse` or the web UI")
        if self.kind == "agent":
            return (f"an agent's channel writes only 'agent' or 'agent:{self.name}' — "
                    "a person grants, lifts holds and purges through `upulse` or the web UI")
        return "a person writes any origin"

    def require_person(self, permission: str, action: str) -> None:
        """Return if this is a person; NotAuthorized naming `action` otherwise (see
        EventStore.require_person, which records the attempt too)."""
        if not self.is_human:
            raise NotAuthorized(str(self), permission, (
                f"{self} may not {action}: only a person does, through `upulse` or the web "
                "UI (an origin label is not enough)"))

    def acting_as(self, other: Principal) -> None:
        """Return if a handle of this principal may give a handle of `other`; NotAuthorized
        otherwise (a person may hand any, the engine an engine's or an agent's, an agent
        only its own)."""
        if self == other or self.kind == "human" or (
                self.kind == "engine" and other.kind != "human"):
            return
        raise NotAuthorized(str(self), "act_as", f"{self} may not act as {other}: a handle "
                            "is only ever narrowed — open the home through the channel of "
                            f"{other.kind} principals instead")

    @property
    def label(self) -> str:
        """Who, in one word: `human`, `human:<who>`, `engine` or `agent:<name>`."""
        if self.kind == "human":
            return f"human:{self.name}" if self.name else "human"
        return "engine" if self.kind == "engine" else f"agent:{self.name}"

    @property
    def origin(self) -> str:
        """The origin this principal writes its own records under."""
        return "human" if self.kind == "human" else self.label

    def __str__(self) -> str:
        shown = self.channel and self.kind != "engine"
        return f"{self.label} (via {self.channel})" if shown else self.label


WRITE_REFUSED = "write-refused"
"""The kind that records an append refused for its origin."""


class WriteRefused(msgspec.Struct, frozen=True):
    """The data of `write-refused`: `principal` (through `channel`) tried to write an event
    of `kind` on `key` with `origin`, and the store refused it."""

    principal: str
    channel: str
    origin: str
    kind: str
    key: str


register_kind(WRITE_REFUSED, "a store refused an append whose origin its principal may not "
                             "write (the attempt, not the event); key: principal:<principal>; "
                             "data: principal, channel, origin, kind, key", WriteRefused)


def refusal_draft(principal: Principal, draft: EventDraft, minute: int) -> EventDraft:
    """The `write-refused` record of `principal` trying `draft`, written under an origin the
    principal may write; one per principal, kind and origin a minute (a flood of refused
    appends records one line a minute, not a line each)."""
    who = principal.label
    body = WriteRefused(who, principal.channel, draft.origin[:200], draft.kind, draft.key[:200])
    return EventDraft(WRITE_REFUSED, f"principal:{who}", msgspec.to_builtins(body),
                      origin=principal.origin,
                      idem=f"{WRITE_REFUSED}:{who}:{draft.kind}:{draft.origin[:200]}:{minute}")
