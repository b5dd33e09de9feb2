"""Tick records: what a tick that wrote something saw and decided, kept so it can be run again.

A tick that records an effect, a mark or an error attaches a TickRecord to its `tick` event
(stored once in objects/, the event's `hash` names it): the vitals of its two snapshots, the
log position each was folded to, the dedup keys pending, the engine revision that ran it,
the effects it decided and its rule trace. Projection states are not kept: the log up to the
recorded seq folds them again, by whichever projections the chain that replays it has. A
tick that wrote nothing keeps nothing.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from pulse_core._effects import Effect
from pulse_core._errors import ObjectMissing, PulseError, TickNotFound, TickNotRecorded
from pulse_core._events import Event
from pulse_core._projector import load_checkpoint
from pulse_core._rules import Decision, RuleChain, RuleTrace
from pulse_core._snapshot import Projection, Snapshot, VitalReading
from pulse_core.store import EventStore, ObjectStore, Sample

RECORD_VERSION = 1
RECORD_LEVEL = 6
"""zlib's level for records: about a quarter of the JSON's bytes for some 50 µs."""


class RecordedSnapshot(msgspec.Struct, frozen=True):
    """A snapshot without its projections (the log up to `seq` folds them again)."""

    seq: int
    at: int
    number: int
    vitals: dict[str, VitalReading]
    samples: dict[str, tuple[Sample, ...]]
    pending_effects: tuple[str, ...]
    last_tick_ms: int
    started_at: int


class RecordedEffect(msgspec.Struct, frozen=True):
    """One effect (or mark) a tick decided: its tag, dedup key and fields."""

    kind: str
    key: str
    payload: Any


class TickRecord(msgspec.Struct, frozen=True):
    """What tick `number` saw (`prev`, `curr`; prev's projections were folded to
    `prev_folded`) and decided (`effects`, `tick_ms`, `trace`), run by engine `revision`
    (the engine directory's commit; None without one)."""

    number: int
    revision: str | None
    prev: RecordedSnapshot
    curr: RecordedSnapshot
    prev_folded: int
    effects: tuple[RecordedEffect, ...]
    tick_ms: int
    trace: tuple[RuleTrace, ...]
    version: int = RECORD_VERSION


class RecordedTick(msgspec.Struct, frozen=True):
    """A tick record found in a log: the `tick` event's seq and the object's digest."""

    seq: int
    digest: str
    record: TickRecord


def recorded_effects(effects: Sequence[Effect]) -> tuple[RecordedEffect, ...]:
    """`effects` as a record keeps them; one whose fields cannot be encoded is left out (the
    engine drops it too, with an `error` event)."""
    kept: list[RecordedEffect] = []
    for effect in effects:
        try:
            kept.append(RecordedEffect(type(effect).tag(), effect.dedup_key(),
                                       msgspec.to_builtins(effect)))
        except (TypeError, ValueError, PulseError):
            continue
    return tuple(kept)


def _light(snapshot: Snapshot) -> RecordedSnapshot:
    return RecordedSnapshot(
        seq=snapshot.seq, at=snapshot.at, number=snapshot.number, vitals=dict(snapshot.vitals),
        samples=dict(snapshot.samples), pending_effects=tuple(sorted(snapshot.pending_effects)),
        last_tick_ms=snapshot.last_tick_ms, started_at=snapshot.started_at)


def encode_record(prev: Snapshot, curr: Snapshot, prev_folded: int, decision: Decision,
                  trace: Sequence[RuleTrace], *, revision: str | None) -> bytes:
    """The bytes of the record of the tick that ran on (`prev`, `curr`): its JSON, deflated
    (a snapshot's vitals repeat the last of its samples; the trace repeats its rule tiers)."""
    record = TickRecord(curr.number, revision, _light(prev), _light(curr), prev_folded,
                        recorded_effects(decision.effects), decision.tick_ms, tuple(trace))
    return zlib.compress(msgspec.json.encode(record), RECORD_LEVEL)


def decode_record(data: bytes, where: str) -> TickRecord:
    """The TickRecord in `data`; TickNotRecorded when it is not one (`where` names it)."""
    try:
        return msgspec.json.decode(zlib.decompress(data), type=TickRecord)
    except (zlib.error, msgspec.DecodeError) as exc:
        raise TickNotRecorded(f"{where} is not a tick record this pulse can read ({exc})") \
            from None


def snapshots_of(record: TickRecord, prev_states: dict[str, Any],
                 curr_states: dict[str, Any]) -> tuple[Snapshot, Snapshot]:
    """The (prev, curr) the tick of `record` ran on, with these projection states."""
    def whole(light: RecordedSnapshot, states: dict[str, Any]) -> Snapshot:
        return Snapshot(seq=light.seq, at=light.at, number=light.number, vitals=light.vitals,
                        projections=states, pending_effects=frozenset(light.pending_effects),
                        last_tick_ms=light.last_tick_ms, samples=light.samples,
                        started_at=light.started_at)
    return whole(record.prev, prev_states), whole(record.curr, curr_states)


# -- finding records ---------------------------------------------------------------------------


def _number(event: Event) -> int | None:
    number = event.data.get("number") if isinstance(event.data, dict) else None
    return number if isinstance(number, int) else None


async def _load(objects: ObjectStore, event: Event) -> RecordedTick:
    number = _number(event)
    if event.hash is None:
        raise TickNotRecorded(f"tick {number} (event #{event.seq}) has no record: it ran "
                              "before tick records were kept")
    try:
        data = await objects.get(event.hash)
    except ObjectMissing:
        raise TickNotRecorded(f"the record of tick {number} (object {event.hash}) is not in "
                              f"{objects.root}: it was purged, or the home was copied without "
                              "its objects/") from None
    return RecordedTick(event.seq, event.hash, decode_record(data, f"object {event.hash}"))


async def find_tick(events: EventStore, objects: ObjectStore, number: int, *,
                    checkpoints: Path | None = None) -> RecordedTick:
    """The record of tick `number`. TickNotFound when no such tick ran (numbers past the last
    tick the log or the home's tick memo in `checkpoints` knows of); TickNotRecorded when it
    ran but wrote nothing, or its record is gone."""
    last = 0
    async for page in events.pages(kinds=["tick"]):
        for event in page.events:
            found = _number(event)
            if found == number:
                return await _load(objects, event)
            last = max(last, found or 0)
    if checkpoints is not None:
        # the ticker records through this module, so its memo is read from here lazily
        from pulse_core._ticker import MEMO, MEMO_VERSION, TickMemo

        memo = load_checkpoint(checkpoints, MEMO, MEMO_VERSION, TickMemo)
        last = max(last, memo.state.number if memo is not None else 0)
    if not 1 <= number <= last:
        ran = f"ticks 1 to {last} ran" if last else "no tick is on record"
        raise TickNotFound(f"no tick {number} ran on this home ({ran}) — `upulse events "
                           "--kind tick` lists the ticks that wrote something")
    raise TickNotRecorded(f"tick {number} wrote nothing (no effect, mark or error), so "
                          "nothing of it was kept — only ticks that write are recorded "
                          "(`upulse events --kind tick` lists them)")


async def last_recorded(events: EventStore, objects: ObjectStore,
                        count: int) -> list[RecordedTick]:
    """The records of the last `count` ticks that kept one, oldest first (ticks whose record
    is gone are passed over)."""
    found: list[RecordedTick] = []
    if count <= 0:
        return found
    for event in await events.read(kinds=["tick"], newest_first=True, limit=count):
        if event.hash is None:
            continue
        try:
            found.append(await _load(objects, event))
        except TickNotRecorded:
            continue
    return found[::-1]


# -- running a record again --------------------------------------------------------------------


class LogFold:
    """Projection states at chosen positions of a log, folded from its start."""

    def __init__(self, events: EventStore, projections: Sequence[Projection[Any]], *,
                 page: int = 5_000) -> None:
        self.events = events
        self.projections = list(projections)
        self.page = page
        kinds: set[str] | None = set()
        for proj in self.projections:
            kinds = None if proj.kinds is None or kinds is None else kinds | proj.kinds
        self._kinds = None if kinds is None else sorted(kinds)
        self._restart()

    def _restart(self) -> None:
        self.seq = 0
        self.states: dict[str, Any] = {p.name: p.initial() for p in self.projections}

    async def at(self, seq: int) -> dict[str, Any]:
        """Every projection's state over the events up to `seq`."""
        if seq < self.seq:
            self._restart()
        while self.seq < seq and self.projections:
            page = await self.events.read_page(self.seq, kinds=self._kinds, limit=self.page)
            for event in page.events:
                if event.seq > seq:
                    break
                for proj in self.projections:
                    if proj.kinds is None or event.kind in proj.kinds:
                        self.states[proj.name] = proj.apply(self.states[proj.name], event)
            if len(page.events) < self.page or page.events[-1].seq >= seq:
                break
            self.seq = page.events[-1].seq
        self.seq = max(self.seq, seq)
        return dict(self.states)


class Replayed(msgspec.Struct, frozen=True):
    """What a chain decided when run again on a tick's record."""

    effects: tuple[RecordedEffect, ...]
    tick_ms: int
    trace: tuple[RuleTrace, ...]
    errors: tuple[str, ...]


async def replay_tick(chain: RuleChain, fold: LogFold, record: TickRecord) -> Replayed:
    """Run `chain` on the snapshots `record` keeps, with `fold`'s projections folded to them."""
    prev_states = await fold.at(record.prev_folded)
    curr_states = prev_states if record.prev_folded == record.curr.seq \
        else await fold.at(record.curr.seq)
    prev, curr = snapshots_of(record, prev_states, curr_states)
    decision, errors, trace = await chain.run(prev, curr)
    return Replayed(recorded_effects(decision.effects), decision.tick_ms, tuple(trace),
                    tuple(f"{where}: {type(exc).__name__}: {exc}" for where, exc in errors))


class EffectDiff(msgspec.Struct, frozen=True):
    """Recorded effects against replayed ones: `same` in both; `changed` the pairs of one
    kind (and key, when one matches) whose fields differ; `missing` recorded only; `extra`
    replayed only."""

    same: tuple[RecordedEffect, ...] = ()
    changed: tuple[tuple[RecordedEffect, RecordedEffect], ...] = ()
    missing: tuple[RecordedEffect, ...] = ()
    extra: tuple[RecordedEffect, ...] = ()

    @property
    def differs(self) -> int:
        """How many effects differ: changed, missing and extra together."""
        return len(self.changed) + len(self.missing) + len(self.extra)


def diff_effects(recorded: Sequence[RecordedEffect],
                 replayed: Sequence[RecordedEffect]) -> EffectDiff:
    """Pair `recorded` with `replayed`: equal effects first, then the same kind and key,
    then the same kind in order; what is left over is missing or extra."""
    left, right = list(recorded), list(replayed)
    same: list[RecordedEffect] = []
    changed: list[tuple[RecordedEffect, RecordedEffect]] = []
    for match in (lambda a, b: a == b,
                  lambda a, b: (a.kind, a.key) == (b.kind, b.key),
                  lambda a, b: a.kind == b.kind):
        for old in list(left):
            new = next((n for n in right if match(old, n)), None)
            if new is None:
                continue
            left.remove(old)
            right.remove(new)
            if old == new:
                same.append(old)
            else:
                changed.append((old, new))
    return EffectDiff(tuple(same), tuple(changed), tuple(left), tuple(right))
