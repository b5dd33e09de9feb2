"""What a tick sees and how ticks carry on: snapshots holding every sample since the last
tick, the first `prev` after a restart, tick numbers, and the memo that makes both survive."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from pulse_core._clock import Clock
from pulse_core._effects import Mark, effect_draft, mark_draft
from pulse_core._errors import (
    AppendOutcomeUnknown,
    PayloadNotEncodable,
    PulseError,
    StoreUnavailable,
)
from pulse_core._events import EventDraft, encode_data, error_draft, uuid7
from pulse_core._executor_loop import ExecutorLoop
from pulse_core._instruments import Instruments
from pulse_core._projector import Projector, load_checkpoint, save_checkpoint
from pulse_core._rules import Decision, RuleChain, RuleTrace
from pulse_core._snapshot import Snapshot, VitalReading
from pulse_core._tick_records import encode_record
from pulse_core._watchers import Watcher
from pulse_core.store import EventStore, Sample, VitalsStore

MEMO = "tick"
MEMO_VERSION = 1


class TickMemo(msgspec.Struct):
    """The light part of the last snapshot, persisted so the next engine's first `prev` is it."""

    number: int
    at: int
    seq: int
    last_tick_ms: int
    started_at: int
    vitals: dict[str, Sample]


class _Decided(msgspec.Struct):
    """A tick run, and what the ticker moves to once its drafts are stored; kept while the
    store refuses them as unavailable (maybe stored, maybe not), to append them again."""

    drafts: list[EventDraft]
    next_prev: Snapshot
    cursor: int
    decision: Decision
    started: float


class Ticker:
    """Runs `chain` over snapshots of the log, the projections and the vitals.

    Samples count only when taken by this engine (at or after `started_at`) and, for a
    watcher's key, not older than its window (at least twice its interval plus its timeout).
    """

    def __init__(self, chain: RuleChain, watchers: Sequence[Watcher], clock: Clock,
                 checkpoints: Path, default_tick_ms: int) -> None:
        self.chain = chain
        self.clock = clock
        self.checkpoints = checkpoints
        self.number = 0
        self.last_tick_ms = default_tick_ms
        self.last_tick_at: int | None = None
        self.started_at = 0
        self.trace: list[RuleTrace] = []
        self.lock = asyncio.Lock()
        #: the host its effects and marks are bound to ('' while the log is this engine's own)
        self.host = ""
        #: given the `error` drafts of a tick the store refused as unavailable, to record late,
        #: and whether that append may be stored (AppendOutcomeUnknown)
        self.unrecorded: Callable[[list[EventDraft], bool], None] | None = None
        #: told of each tick that completes (the engine sets its instruments)
        self.instruments = Instruments()
        #: the engine directory's revision the chain runs, kept in each tick record
        self.revision: str | None = None
        #: whether a tick that writes keeps its record (see pulse_core._tick_records)
        self.records = True
        self._prev: Snapshot | None = None
        self._owed: _Decided | None = None
        self._resumed: TickMemo | None = None
        self._cursor = 0
        self._max_age = {w.key: int(max(w.window, 2 * w.interval + w.timeout) * 1000)
                         for w in watchers}

    async def resume(self, events: EventStore, vitals: VitalsStore) -> None:
        """Carry on from the last run: its memo, and tick numbers past any it recorded."""
        found = await asyncio.to_thread(load_checkpoint, self.checkpoints, MEMO, MEMO_VERSION,
                                        TickMemo)
        if found is not None:
            self._resumed = found[1]
            self.number = self._resumed.number
        # A crash loses up to one memo interval; the last recorded tick is a floor, so numbers
        # in the log never repeat (a quiet tick since the memo may have its number reused).
        last = await events.read(kinds=["tick"], key="engine", limit=1, newest_first=True)
        number = last[0].data.get("number") if last and isinstance(last[0].data, dict) else None
        if isinstance(number, int):
            self.number = max(self.number, number)
        self._cursor = await vitals.cursor()
        self.started_at = self.clock.now_ms()

    def _fresh(self, sample: Sample, now: int) -> bool:
        if sample.ts < self.started_at:
            return False
        limit = self._max_age.get(sample.key)
        return limit is None or now - sample.ts <= limit

    async def snapshot(self, projector: Projector, executors: ExecutorLoop,
                       vitals: VitalsStore) -> tuple[Snapshot, int]:
        """The snapshot the next tick sees, and the vitals cursor it reached."""
        # Pending are the effects unfinished before the projections are read, so one the
        # rule sees finished is folded into them (it never sees one finished in neither, and
        # emits it again), and those unfinished after: another engine sharing the log may
        # have decided one meanwhile, which the projections already show. Vitals are read
        # meanwhile.
        _, (cursor, latest, recent) = await asyncio.gather(
            executors.refresh(), vitals.for_tick(self._cursor))
        pending = executors.pending_dedup_keys()
        states = await projector.catch_up()
        await executors.refresh()
        pending |= executors.pending_dedup_keys()
        now = self.clock.now_ms()
        samples = {k: tuple(s for s in found if s.ts >= self.started_at)
                   for k, found in recent.items()}
        return Snapshot(
            seq=projector.seq, at=now, number=self.number + 1,
            vitals={k: VitalReading(s, now - s.ts) for k, s in latest.items()
                    if self._fresh(s, now)},
            projections=states, pending_effects=pending,
            last_tick_ms=self.last_tick_ms,
            samples={k: v for k, v in samples.items() if v}, started_at=self.started_at,
        ), cursor

    def _first_prev(self, curr: Snapshot) -> Snapshot:
        memo = self._resumed
        if memo is None:
            return Snapshot(seq=0, at=curr.at, number=0, vitals={},
                            projections=curr.projections, last_tick_ms=curr.last_tick_ms)
        return Snapshot(seq=memo.seq, at=memo.at, number=memo.number,
                        vitals={k: VitalReading(s, memo.at - s.ts) for k, s in memo.vitals.items()},
                        projections=curr.projections, last_tick_ms=memo.last_tick_ms,
                        started_at=memo.started_at)

    async def tick(self, projector: Projector, executors: ExecutorLoop, vitals: VitalsStore,
                   events: EventStore) -> Decision:
        """Run the chain once; append its effects, marks, errors and a tick record together.

        Every draft carries an idempotency key. When the store refuses the append as
        unavailable (maybe stored, maybe not), the next call appends the same drafts again
        (stored at most once) and completes that tick instead of running the chain anew,
        which would decide its effects a second time under new effect ids.
        """
        async with self.lock:
            if self._owed is not None:
                owed = self._owed
                try:
                    await events.append(owed.drafts)
                except StoreUnavailable:
                    raise
                except PulseError:
                    self._owed = None  # refused for good, so not stored: run ticks anew
                    raise
                self._owed = None
                return self._done(owed)
            started = time.perf_counter()
            curr, cursor = await self.snapshot(projector, executors, vitals)
            prev = self._prev or self._first_prev(curr)
            prev_folded = curr.seq if self._prev is None else prev.seq
            decision, errors, self.trace = await self.chain.run(prev, curr)
            drafts = _drafts(decision, curr.seq or None, self.host)
            drafts += [error_draft(where, exc, host=self.host) for where, exc in errors]
            if drafts:
                drafts.append(EventDraft(
                    "tick", "engine", {"number": curr.number, "tick_ms": decision.tick_ms,
                                       "effects": [d.key for d in drafts if d.kind == "effect"],
                                       "errors": sum(d.kind == "error" for d in drafts),
                                       "seen_seq": curr.seq},
                    origin="engine",
                    attachment=encode_record(prev, curr, prev_folded, decision, self.trace,
                                             revision=self.revision)
                    if self.records else None))
            # The next prev keeps the last reading of keys not sampled since (a watcher's first
            # sample after a restart may land after the first tick): a comparison of prev and
            # curr then sees no change where there was none.
            next_prev = msgspec.structs.replace(curr, vitals={**prev.vitals, **curr.vitals})
            done = _Decided([], next_prev, cursor, decision, started)
            if drafts:
                token = uuid7()
                drafts = [msgspec.structs.replace(d, idem=f"tick:{token}:{i}")
                          for i, d in enumerate(drafts)]
                try:
                    await events.append(drafts)
                except StoreUnavailable as exc:
                    # Its errors are recorded late by the error reports (marked so, unless
                    # they may be stored already: then sent again as they are); the rest
                    # waits for the next call.
                    if self.unrecorded is not None:
                        self.unrecorded([d for d in drafts if d.kind == "error"],
                                        isinstance(exc, AppendOutcomeUnknown))
                    done.drafts = [d for d in drafts if d.kind != "error"]
                    self._owed = done
                    raise
            return self._done(done)

    def _done(self, tick: _Decided) -> Decision:
        """Move on past `tick`, stored."""
        curr = tick.next_prev
        self._prev = curr
        self._cursor = tick.cursor
        self.number = curr.number
        self.last_tick_ms = tick.decision.tick_ms
        self.last_tick_at = curr.at
        self.instruments.tick(curr.number, time.perf_counter() - tick.started)
        return tick.decision

    async def save_memo(self) -> None:
        """Persist the last snapshot's light part (raises OSError when the disk refuses)."""
        prev = self._prev
        if prev is None:
            return
        memo = TickMemo(prev.number, prev.at, prev.seq, self.last_tick_ms, prev.started_at,
                        {k: r.sample for k, r in prev.vitals.items()})
        await asyncio.to_thread(save_checkpoint, self.checkpoints, MEMO, MEMO_VERSION, prev.seq,
                                memo)


def _drafts(decision: Decision, cause: int | None, host: str) -> list[EventDraft]:
    """The events of a decision's effects and marks; one that cannot be encoded becomes an
    `error` event instead, so it never costs the others (the survival layer's included)."""
    drafts: list[EventDraft] = []
    for effect in decision.effects:
        try:  # to_builtins raises for a field msgspec cannot encode, encode_data for NaN etc.
            draft = (mark_draft(effect, "engine:tick", cause, host=host)
                     if isinstance(effect, Mark)
                     else effect_draft(effect, "engine:tick", cause, host=host))
            encode_data(draft.data, draft.key)
        except (TypeError, ValueError, PulseError) as exc:
            dropped = PayloadNotEncodable(
                f"{type(effect).__name__} ({type(effect).tag()!r}) was dropped: {exc}")
            drafts.append(error_draft("engine:tick", dropped, host=host))
        else:
            drafts.append(draft)
    return drafts
