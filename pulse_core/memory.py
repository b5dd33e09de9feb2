"""The agent's memory held in the log: identities and what is known about each.

Every memory event is keyed `identity:<id>`, so an identity's version counts its memory
events and its history reads with one key. Inside, records have ids (`record`): a human
exchange, a state item, an unresolved item, an observation, a temporal fact, a reflection.
A forgotten, quarantined or purged (`element-purged`, pulse_core/maintenance/_elements.py) record is
dropped from the current form and is never evidence again; the events that wrote it stay in
the log.

Element text (what was said, state values, open items, facts, reflections) is sealed with
the element's key when a home's store appends it (pulse_core/store/_keys.py), so the fold
holds sealed tokens: `reveal_memory` opens them for a reader, and a purge that destroys the
key leaves them unreadable everywhere (docs/memory.md, "Purge erases").
"""

from __future__ import annotations

from typing import Any

import msgspec

from pulse_core._errors import RecallRefused, UnknownIdentity
from pulse_core._events import QUARANTINED, Event, EventDraft, register_kind, uuid7
from pulse_core._memory_text import reveal_memory
from pulse_core._pmap import PersistentMap
from pulse_core._recall import (
    Recalled,
    RecallQuery,
    recallable,
    recallable_form,
    recallable_from_events,
)
from pulse_core._recaller import Recaller, recall
from pulse_core._snapshot import Projection
from pulse_core.store import EventStore

SEVERITIES = ("routine", "notice", "warning", "critical")
KEEP_EXCHANGES = 50
KEEP_OBSERVATIONS = 200
KEEP_FACTS = 100


__all__ = [
    "Exchange",
    "HumanExchange",
    "IdentityMemory",
    "IdentityRegistered",
    "Memory",
    "MemoryBoard",
    "Note",
    "Observation",
    "ObservationRecorded",
    "RecallQuery",
    "RecallRefused",
    "Recalled",
    "Recaller",
    "ReflectionRecorded",
    "Retraction",
    "StateItem",
    "StateRevised",
    "StateSet",
    "TemporalFactRecorded",
    "UnknownIdentity",
    "Unresolved",
    "UnresolvedOpened",
    "exchange_draft",
    "identity_key",
    "recall",
    "recallable",
    "recallable_form",
    "recallable_from_events",
    "remember",
    "reveal_memory",
]


def identity_key(identity: str) -> str:
    """The event key of an identity's memory."""
    return f"identity:{identity}"


class _Record(msgspec.Struct, frozen=True, kw_only=True):
    record: str


class IdentityRegistered(msgspec.Struct, frozen=True):
    """identity-registered."""

    name: str = ""


class HumanExchange(_Record, frozen=True, kw_only=True):
    """human-exchange: something a human said (or the agent answered)."""

    text: str
    role: str = "human"


class StateSet(_Record, frozen=True, kw_only=True):
    """state-set: a state item written with an authority stronger than the reviewer's."""

    value: Any
    confidence: float = 1.0
    protected: bool = False
    immutable: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence {self.confidence} is outside 0..1")


class StateRevised(_Record, frozen=True, kw_only=True):
    """state-revised: a change to an existing state item's value or confidence."""

    value: Any = None
    value_changed: bool = False
    confidence: float | None = None
    reason: str = ""


class Retraction(_Record, frozen=True, kw_only=True):
    """state-retracted, unresolved-resolved, record-forgotten, record-quarantined."""

    reason: str = ""


class UnresolvedOpened(_Record, frozen=True, kw_only=True):
    """unresolved-opened: something left open to come back to."""

    text: str
    priority: int = 0


class ObservationRecorded(_Record, frozen=True, kw_only=True):
    """observation-recorded: something sensed, routine or above routine."""

    source: str
    key: str
    value: Any = None
    severity: str = "routine"
    routine: bool = True
    at: int = 0

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")


class TemporalFactRecorded(_Record, frozen=True, kw_only=True):
    """temporal-fact-recorded: a fact true over a span of time."""

    text: str
    valid_from: int | None = None
    valid_until: int | None = None


class ReflectionRecorded(_Record, frozen=True, kw_only=True):
    """reflection-recorded: the agent's own summary of a stretch of time."""

    text: str


for _kind, _doc, _type in (
    ("identity-registered", "an identity the agent knows; key: identity:<id>",
     IdentityRegistered),
    ("human-exchange", "a human exchange; makes the identity eligible for review",
     HumanExchange),
    ("state-set", "a state item set by the agent or a human", StateSet),
    ("state-revised", "a state item's value or confidence revised", StateRevised),
    ("state-retracted", "a state item withdrawn", Retraction),
    ("unresolved-opened", "an unresolved item opened", UnresolvedOpened),
    ("unresolved-resolved", "an unresolved item resolved", Retraction),
    ("observation-recorded", "an observation about the identity", ObservationRecorded),
    ("temporal-fact-recorded", "a fact with a time span", TemporalFactRecorded),
    ("reflection-recorded", "a reflection", ReflectionRecorded),
    ("record-forgotten", "a record forgotten: never evidence again", Retraction),
    ("record-quarantined", "a record quarantined: never evidence again", Retraction),
):
    register_kind(_kind, _doc, _type)

MEMORY_KINDS = frozenset({
    "identity-registered", "human-exchange", "state-set", "state-revised", "state-retracted",
    "unresolved-opened", "unresolved-resolved", "observation-recorded",
    "temporal-fact-recorded", "reflection-recorded", "record-forgotten", "record-quarantined",
    "element-purged",  # registered by pulse_core.maintenance: a purge removes like a forget
})


class Exchange(msgspec.Struct, frozen=True, gc=False):
    """A human exchange as evidence."""

    record: str
    text: str
    role: str
    ts: int
    seq: int


class StateItem(msgspec.Struct, frozen=True, gc=False):
    """A state item's current form; `by` is the origin of its last write (who set or last
    revised it), which ranks that write's authority (pulse_core's Authority)."""

    record: str
    value: Any
    confidence: float
    protected: bool
    immutable: tuple[str, ...]
    updated_at: int
    by: str = ""


class Unresolved(msgspec.Struct, frozen=True, gc=False):
    """An open unresolved item."""

    record: str
    text: str
    priority: int
    opened_at: int


class Observation(msgspec.Struct, frozen=True, gc=False):
    """An observation; `origin` tells who recorded it (loop safety)."""

    record: str
    source: str
    key: str
    value: Any
    severity: str
    routine: bool
    at: int
    origin: str


class Note(msgspec.Struct, frozen=True, gc=False):
    """A temporal fact or a reflection."""

    record: str
    text: str
    ts: int
    valid_from: int | None = None
    valid_until: int | None = None


class IdentityMemory(msgspec.Struct, frozen=True):
    """Everything currently known about one identity, minus forgotten and quarantined records."""

    identity: str
    name: str = ""
    exchanges: tuple[Exchange, ...] = ()
    state: dict[str, StateItem] = {}
    unresolved: dict[str, Unresolved] = {}
    observations: dict[str, Observation] = {}
    facts: dict[str, Note] = {}
    reflection: Note | None = None
    removed: frozenset[str] = frozenset()
    version: int = 0

    @property
    def last_human(self) -> Exchange | None:
        """The newest human exchange still remembered."""
        for exchange in reversed(self.exchanges):
            if exchange.role == "human":
                return exchange
        return None


def _bounded(items: dict[str, Any], keep: int) -> dict[str, Any]:
    return dict(list(items.items())[-keep:]) if len(items) > keep else items


def remember(memory: IdentityMemory | None, event: Event) -> IdentityMemory:
    """The identity's memory after `event` (a pure function: `memory` is not changed)."""
    mem = memory or IdentityMemory(event.key.removeprefix("identity:"))
    data = event.data if isinstance(event.data, dict) else {}
    record = str(data.get("record", ""))
    replace = msgspec.structs.replace
    if event.kind in ("record-forgotten", "record-quarantined", "element-purged"):
        return replace(
            mem, version=event.version, removed=mem.removed | {record},
            exchanges=tuple(x for x in mem.exchanges if x.record != record),
            state={k: v for k, v in mem.state.items() if v.record != record},
            unresolved={k: v for k, v in mem.unresolved.items() if k != record},
            observations={k: v for k, v in mem.observations.items() if k != record},
            facts={k: v for k, v in mem.facts.items() if k != record},
            reflection=None if mem.reflection and mem.reflection.record == record
            else mem.reflection)
    if record in mem.removed:
        return replace(mem, version=event.version)  # a removed record never comes back
    changes: dict[str, Any] = {"version": event.version}
    kind = event.kind
    if kind == "identity-registered":
        changes["name"] = str(data.get("name", ""))
    elif kind == "human-exchange":
        body = event.payload(HumanExchange)
        exchange = Exchange(record, body.text, body.role, event.ts, event.seq)
        changes["exchanges"] = (*mem.exchanges[-(KEEP_EXCHANGES - 1):], exchange)
    elif kind == "state-set":
        item = event.payload(StateSet)
        changes["state"] = {**mem.state, record: StateItem(
            record, item.value, item.confidence, item.protected, item.immutable, event.ts,
            event.origin)}
    elif kind == "state-revised" and record in mem.state:
        rev = event.payload(StateRevised)
        old = mem.state[record]
        changes["state"] = {**mem.state, record: replace(
            old, value=rev.value if rev.value_changed else old.value,
            confidence=old.confidence if rev.confidence is None else rev.confidence,
            updated_at=event.ts, by=event.origin)}
    elif kind == "state-retracted":
        changes["state"] = {k: v for k, v in mem.state.items() if k != record}
    elif kind == "unresolved-opened":
        body_u = event.payload(UnresolvedOpened)
        changes["unresolved"] = {**mem.unresolved, record: Unresolved(
            record, body_u.text, body_u.priority, event.ts)}
    elif kind == "unresolved-resolved":
        changes["unresolved"] = {k: v for k, v in mem.unresolved.items() if k != record}
    elif kind == "observation-recorded":
        obs = event.payload(ObservationRecorded)
        changes["observations"] = _bounded({**mem.observations, record: Observation(
            record, obs.source, obs.key, obs.value, obs.severity, obs.routine,
            obs.at or event.ts, event.origin)}, KEEP_OBSERVATIONS)
    elif kind == "temporal-fact-recorded":
        fact = event.payload(TemporalFactRecorded)
        changes["facts"] = _bounded({**mem.facts, record: Note(
            record, fact.text, event.ts, fact.valid_from, fact.valid_until)}, KEEP_FACTS)
    elif kind == "reflection-recorded":
        changes["reflection"] = Note(record, event.payload(ReflectionRecorded).text, event.ts)
    return replace(mem, **changes)


class Memory(Projection[PersistentMap[str, IdentityMemory]]):
    """Every identity's current memory, by identity id."""

    name = "memory"
    kinds = MEMORY_KINDS | {QUARANTINED}  # a quarantine moves an identity's version on
    version = 3

    def initial(self) -> PersistentMap[str, IdentityMemory]:
        return PersistentMap()

    def apply(self, state: PersistentMap[str, IdentityMemory], event: Event
              ) -> PersistentMap[str, IdentityMemory]:
        if not event.key.startswith("identity:"):
            return state
        identity = event.key.removeprefix("identity:")
        return state.set(identity, remember(state.get(identity), event))


def exchange_draft(identity: str, text: str, role: str = "human", *, record: str | None = None,
                   origin: str = "agent") -> EventDraft:
    """The `human-exchange` event `MemoryBoard.exchange` appends, for a writer that appends it
    with others in one batch (a transcript follower: its messages and its cursor). Who spoke
    is `role`; the origin is the writer's own (`origin`): an agent's channel that records
    what a person said writes it as itself, never as the person; `record` defaults to a new
    id."""
    body = HumanExchange(record=record or f"x-{uuid7()}", text=text, role=role)
    return EventDraft("human-exchange", identity_key(identity), msgspec.to_builtins(body),
                      origin=origin)


class MemoryBoard:
    """Writes memory events; each method returns the stored event."""

    def __init__(self, store: EventStore, origin: str = "agent") -> None:
        self.store = store
        self.origin = origin

    async def write(self, identity: str, kind: str, body: Any, *, origin: str | None = None,
                    cause: int | None = None) -> Event:
        """Append one memory event for `identity` (body: a payload Struct or a dict)."""
        data = msgspec.to_builtins(body)
        draft = EventDraft(kind, identity_key(identity), data, origin=origin or self.origin,
                           cause=cause)
        return (await self.store.append([draft])).events[0]

    async def register(self, identity: str, name: str = "") -> Event:
        """Make an identity known."""
        return await self.write(identity, "identity-registered", IdentityRegistered(name))

    async def exchange(self, identity: str, text: str, role: str = "human") -> Event:
        """Record a human exchange (its record id is returned in the event's data). A human
        turn is origin `human` when a person holds the store handle (someone typing at
        `upulse memory exchange`), the board's own origin otherwise (an agent's channel
        that saw a person speak is not one)."""
        person = role == "human" and self.store.principal.is_human
        draft = exchange_draft(identity, text, role, origin="human" if person else self.origin)
        return (await self.store.append([draft])).events[0]

    async def set_state(self, identity: str, item: str, value: Any, *, confidence: float = 1.0,
                        protected: bool = False, immutable: tuple[str, ...] = ()) -> Event:
        """Set a state item with the agent's (or a human's) authority."""
        return await self.write(identity, "state-set", StateSet(
            record=item, value=value, confidence=confidence, protected=protected,
            immutable=immutable))

    async def open_unresolved(self, identity: str, text: str, priority: int = 0) -> Event:
        """Open an unresolved item."""
        return await self.write(identity, "unresolved-opened", UnresolvedOpened(
            record=f"u-{uuid7()}", text=text, priority=priority))

    async def observe(self, identity: str, source: str, key: str, value: Any, *,
                      severity: str = "routine", routine: bool = True, at: int = 0) -> Event:
        """Record an observation."""
        return await self.write(identity, "observation-recorded", ObservationRecorded(
            record=f"o-{uuid7()}", source=source, key=key, value=value, severity=severity,
            routine=routine, at=at))

    async def fact(self, identity: str, text: str, valid_from: int | None = None,
                   valid_until: int | None = None) -> Event:
        """Record a temporal fact."""
        return await self.write(identity, "temporal-fact-recorded", TemporalFactRecorded(
            record=f"f-{uuid7()}", text=text, valid_from=valid_from, valid_until=valid_until))

    async def reflect(self, identity: str, text: str) -> Event:
        """Record a reflection."""
        return await self.write(identity, "reflection-recorded",
                                ReflectionRecorded(record=f"r-{uuid7()}", text=text))

    async def forget(self, identity: str, record: str, reason: str = "") -> Event:
        """Forget a record: it is never evidence again."""
        return await self.write(identity, "record-forgotten",
                                Retraction(record=record, reason=reason))

    async def quarantine(self, identity: str, record: str, reason: str = "") -> Event:
        """Quarantine a record: it is never evidence again. Only a person's handle may
        (NotAuthorized otherwise)."""
        await self.store.require_person("record-quarantined", identity_key(identity),
                                        f"quarantine record {record!r}")
        return await self.write(identity, "record-quarantined",
                                Retraction(record=record, reason=reason))
