"""What an operator sees of the agent's memory: every identity with its record counts, and
one identity's records with who wrote each and when. Read from the log; nothing is written.

Both views fold the `Memory` projection (`pulse_core.memory.remember`) over memory events, so
they show exactly the current form the rules and the awareness reviewer read: a forgotten,
quarantined or purged record appears only as a removal (what it was, how, why, by whom), never
with its content. Sealed element text is opened with the store's keys (`EventStore.keys`);
a missing or changed key is an ElementTextUnreadable naming the element. One identity's
view also reads who set or revised each record from its key's history. Every view is a frozen
Struct: `msgspec.to_builtins(view)` is plain JSON data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import msgspec

from pulse_core._events import Event
from pulse_core._projector import Projector
from pulse_core.memory import Exchange, IdentityMemory, Memory, Note, identity_key, remember
from pulse_core.store import ElementKeys, EventStore, reveal

SHOWN = 20
"""How many exchanges, observations, facts and removals one identity's view lists, newest
first, unless told otherwise."""

_RECORD_TYPES = {
    "human-exchange": "exchange", "state-set": "state", "unresolved-opened": "unresolved",
    "observation-recorded": "observation", "temporal-fact-recorded": "fact",
    "reflection-recorded": "reflection",
}
_REMOVALS = {"record-forgotten": "forgotten", "record-quarantined": "quarantined",
             "element-purged": "purged"}


class RecordCounts(msgspec.Struct, frozen=True):
    """How many records of each type an identity's current memory holds: exchanges,
    observations and facts are bounded as the projection keeps them (50, 200, 100), and
    `reflections` is 0 or 1 (only the latest is current)."""

    exchanges: int
    state: int
    unresolved: int
    observations: int
    facts: int
    reflections: int
    removed: int


def count_records(memory: IdentityMemory) -> RecordCounts:
    """The record counts of one identity's current memory."""
    return RecordCounts(
        len(memory.exchanges), len(memory.state), len(memory.unresolved),
        len(memory.observations), len(memory.facts), int(memory.reflection is not None),
        len(memory.removed))


class IdentitySummary(msgspec.Struct, frozen=True):
    """One identity in the list: its id, display name, memory version, record counts and
    newest remembered exchange (either role; None without one)."""

    identity: str
    name: str
    version: int
    counts: RecordCounts
    last_exchange: Exchange | None


def summarise_identities(memory: Mapping[str, IdentityMemory],
                         keys: ElementKeys | None = None) -> list[IdentitySummary]:
    """Every identity of a `Memory` projection state (an engine's live one, or
    `read_identities`' fold), sorted by id; sealed text opened with `keys` (blocking)."""
    return [IdentitySummary(mem.identity, mem.name, mem.version, count_records(mem),
                            _opened(mem.exchanges[-1], keys) if mem.exchanges else None)
            for _, mem in sorted(memory.items())]


def _opened(exchange: Exchange, keys: ElementKeys | None) -> Exchange:
    return msgspec.structs.replace(exchange, text=reveal(exchange.text, keys))


async def read_identities(store: EventStore) -> list[IdentitySummary]:
    """Every identity with memory in `store`'s log, sorted by id: the `Memory` projection
    folded from the start of the log, without checkpoints, so nothing is written (a store
    opened read-only will do)."""
    states = await Projector(store, [Memory()]).catch_up()
    memory: Mapping[str, IdentityMemory] = states[Memory.name]
    return await asyncio.to_thread(summarise_identities, memory, store.keys)


class ExchangeRecord(msgspec.Struct, frozen=True):
    """A remembered exchange: what was said, by which side (`role`), when (ms), its event's
    seq and origin (`by`)."""

    record: str
    text: str
    role: str
    at: int
    seq: int
    by: str


class StateRecord(msgspec.Struct, frozen=True):
    """A state item: its value and confidence now, who set it and when, and the latest
    revision since (None when it was not revised)."""

    item: str
    value: Any
    confidence: float
    protected: bool
    immutable: tuple[str, ...]
    set_by: str
    set_at: int
    revised_by: str | None = None
    revised_at: int | None = None
    revision_reason: str = ""


class UnresolvedRecord(msgspec.Struct, frozen=True):
    """An open unresolved item, who opened it and when."""

    record: str
    text: str
    priority: int
    opened_at: int
    opened_by: str


class ObservationRecord(msgspec.Struct, frozen=True):
    """An observation: what was sensed (`source`, `key`, `value`), how notable, when and by
    whom."""

    record: str
    source: str
    key: str
    value: Any
    severity: str
    routine: bool
    at: int
    by: str


class NoteRecord(msgspec.Struct, frozen=True):
    """A temporal fact (with its span, ms) or the current reflection, when and by whom."""

    record: str
    text: str
    at: int
    by: str
    valid_from: int | None = None
    valid_until: int | None = None


class RemovedRecord(msgspec.Struct, frozen=True):
    """A record forgotten or quarantined (`how`): what it was (`exchange`, `state`, ...; ""
    when the log never wrote it), why, when and by whom. Its content is not shown."""

    record: str
    was: str
    how: str
    reason: str
    at: int
    by: str


class IdentityRecords(msgspec.Struct, frozen=True):
    """One identity's current memory as an operator reads it. Exchanges, observations, facts
    and removals are newest first and bounded (`read_identity`'s `shown`; `counts` has the
    totals); state items are sorted by name, unresolved items by priority, then newest."""

    identity: str
    name: str
    version: int
    counts: RecordCounts
    exchanges: tuple[ExchangeRecord, ...]
    state: tuple[StateRecord, ...]
    unresolved: tuple[UnresolvedRecord, ...]
    observations: tuple[ObservationRecord, ...]
    facts: tuple[NoteRecord, ...]
    reflection: NoteRecord | None
    removed: tuple[RemovedRecord, ...]


class _Writer(msgspec.Struct, frozen=True):
    by: str
    at: int
    reason: str = ""


class _Provenance:
    """Who wrote each record of one identity, folded beside its memory."""

    def __init__(self) -> None:
        self.memory: IdentityMemory | None = None
        self.first: dict[str, tuple[str, _Writer]] = {}  # record: (its type, first writer)
        self.set: dict[str, _Writer] = {}
        self.revised: dict[str, _Writer] = {}
        self.removed: dict[str, RemovedRecord] = {}

    def fold(self, event: Event) -> None:
        self.memory = remember(self.memory, event)
        data = event.data if isinstance(event.data, dict) else {}
        record = str(data.get("record", ""))
        writer = _Writer(event.origin, event.ts, str(data.get("reason", "")))
        if event.kind in _REMOVALS:
            if record not in self.removed:
                was = self.first.get(record, ("", writer))[0]
                self.removed[record] = RemovedRecord(
                    record, was, _REMOVALS[event.kind], writer.reason, event.ts, event.origin)
            return
        if record in self.removed:
            return  # ignored by the fold as well: a removed record never comes back
        if event.kind in _RECORD_TYPES:
            self.first.setdefault(record, (_RECORD_TYPES[event.kind], writer))
        if event.kind == "state-set":
            self.set[record] = writer
            self.revised.pop(record, None)
        elif event.kind == "state-revised" and record in self.memory.state:
            self.revised[record] = writer

    def by(self, record: str) -> str:
        found = self.first.get(record)
        return found[1].by if found else ""

    def records(self, shown: int) -> IdentityRecords:
        mem = self.memory
        assert mem is not None
        note = self._note
        state = []
        for item in sorted(mem.state.values(), key=lambda s: s.record):
            setter = self.set.get(item.record, _Writer("", item.updated_at))
            revision = self.revised.get(item.record)
            state.append(StateRecord(
                item.record, item.value, item.confidence, item.protected, item.immutable,
                setter.by, setter.at, revision.by if revision else None,
                revision.at if revision else None, revision.reason if revision else ""))
        return IdentityRecords(
            mem.identity, mem.name, mem.version, count_records(mem),
            exchanges=tuple(ExchangeRecord(x.record, x.text, x.role, x.ts, x.seq,
                                           self.by(x.record))
                            for x in reversed(mem.exchanges[-shown:] if shown else ())),
            state=tuple(state),
            unresolved=tuple(UnresolvedRecord(u.record, u.text, u.priority, u.opened_at,
                                              self.by(u.record))
                             for u in sorted(mem.unresolved.values(),
                                             key=lambda u: (-u.priority, -u.opened_at))),
            observations=tuple(ObservationRecord(o.record, o.source, o.key, o.value,
                                                 o.severity, o.routine, o.at, o.origin)
                               for o in _newest(list(mem.observations.values()), shown)),
            facts=tuple(note(f) for f in _newest(list(mem.facts.values()), shown)),
            reflection=None if mem.reflection is None else note(mem.reflection),
            removed=tuple(_newest(list(self.removed.values()), shown)))

    def _note(self, note: Note) -> NoteRecord:
        return NoteRecord(note.record, note.text, note.ts, self.by(note.record),
                          note.valid_from, note.valid_until)


def _newest(items: list[Any], shown: int) -> list[Any]:
    """The last `shown` of `items` (kept in the order they were written), newest first."""
    return list(reversed(items[-shown:])) if shown else []


async def read_identity(store: EventStore, identity: str, *, shown: int = SHOWN
                        ) -> IdentityRecords | None:
    """The records of `identity` (None when the log holds no memory of it): its memory
    events folded as the `Memory` projection folds them, with who wrote each record. Reads
    the identity's key only and writes nothing; `shown` bounds the exchanges, observations,
    facts and removals listed (0 lists none; `counts` always has the totals)."""
    if shown < 0:
        raise ValueError(f"shown={shown}: give 0 or more")
    history = await store.read(kinds=Memory.kinds, key=identity_key(identity))
    if not history:
        return None
    provenance = _Provenance()
    for event in history:
        provenance.fold(event)
    return await asyncio.to_thread(_revealed, provenance.records(shown), store.keys)


def _revealed(records: IdentityRecords, keys: ElementKeys | None) -> IdentityRecords:
    """`records` with their sealed text opened (purged text reads as PURGED_TEXT)."""
    replace = msgspec.structs.replace
    return replace(
        records,
        exchanges=tuple(replace(x, text=reveal(x.text, keys)) for x in records.exchanges),
        state=tuple(replace(s, value=reveal(s.value, keys), revision_reason=reveal(
            s.revision_reason, keys)) for s in records.state),
        unresolved=tuple(replace(u, text=reveal(u.text, keys)) for u in records.unresolved),
        observations=tuple(replace(o, value=reveal(o.value, keys))
                           for o in records.observations),
        facts=tuple(replace(f, text=reveal(f.text, keys)) for f in records.facts),
        reflection=None if records.reflection is None
        else replace(records.reflection, text=reveal(records.reflection.text, keys)))
