"""The quiet hold: per identity, unchanged checks skipped since the last review, the last
check and the hold's end — kept in memory, loaded from and written behind the side store.

Skips are not events: a quiet world costs no log growth, and the next real review reports the
silent interval truthfully from this count. The side store (the home's state.db, or Redis /
Valkey shared by a fleet) only carries the hold across restarts and engines. When it fails
(closed, locked, a Redis outage), the reviewer runs on the hold it has in memory (no stored
hold: one more check at worst), never waits for the store again until it answers, keeps every
change, and records one `error` event (where `rule:awareness`, type QuietHoldUnavailable) per
outage; once the store answers, the stored hold is read again, every hold in memory written
back (a restarted Redis holds nothing), and one `awareness-quiet-hold-restored` event says so.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_right

import msgspec

from pulse_core import EventDraft, EventStore, PulseError, SideStore, error_draft, register_kind

NAMESPACE = "awareness.quiet"
"""The side-store namespace of the hold: one value per identity."""

WHERE = "rule:awareness"
"""Where (the `error` event's key and origin) a side-store failure of the hold is reported:
the awareness rule, whose reads and writes they are."""

log = logging.getLogger("pulse")


class QuietHoldUnavailable(PulseError):
    """The side store failed; the reviewer runs without the stored quiet hold (one more check
    at worst) and writes its changes once the store answers again."""


class QuietHoldRestored(msgspec.Struct, frozen=True):
    """The side store answers again after `failures` failed reads and writes: the stored hold
    was read again and every hold in memory written back."""

    failures: int
    message: str


RESTORED = "awareness-quiet-hold-restored"
register_kind(RESTORED, "the quiet hold's side store answers again after an outage; key: "
                        "rule:awareness; data: failures, message", QuietHoldRestored)


class QuietState(msgspec.Struct, frozen=True, gc=False):
    """Unchanged checks skipped since the last review, the last check, and the hold's end;
    and the later checks of a world found unchanged, deemed made at these times (ms), each
    one more skip that renews the hold: while nothing about the identity changes, each would
    find the same world, so the reviewer does not make them one by one."""

    skips: int = 0
    last_check_at: int = 0
    hold_until: int = 0
    deemed: tuple[int, ...] = ()

    def at(self, as_of: int) -> QuietState:
        """The state once the deemed checks due by `as_of` are made."""
        deemed = self.deemed
        if not deemed or deemed[0] > as_of:
            return self
        made = bisect_right(deemed, as_of)
        last = deemed[made - 1]
        return QuietState(self.skips + made, last, last + self.hold_until - self.last_check_at,
                          deemed[made:])

    def made(self, as_of: int) -> int:
        """How many of the deemed checks are due by `as_of`."""
        return bisect_right(self.deemed, as_of) if self.deemed else 0


_NONE = QuietState()
"""The state of an identity with no quiet bookkeeping."""

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(QuietState).decode


class QuietHold:
    """Quiet state for every identity, read from memory.

    After `bind`, the stored hold is merged in by the first `load` and every change is written
    behind by `write_behind`: one `put` of all changed identities at a time (each value living
    `ttl_ms` in the store, when given), never waited for by the tick. Unbound, the hold lives
    in memory only. A state is read as of `as_of`: the deemed checks due by then are made.
    """

    def __init__(self, *, ttl_ms: int | None = None) -> None:
        self.ttl_ms = ttl_ms
        self.as_of = 0
        """The time (ms) the hold is read at: the reviewer's tick."""
        self._states: dict[str, QuietState] = {}
        self._deeming: set[str] = set()
        self._deemed_made = 0
        self._dirty: set[str] = set()
        self._unbased: set[str] = set()
        self._side: SideStore | None = None
        self._events: EventStore | None = None
        self._loaded = False
        self._merged = False
        self._reading: asyncio.Task[bool] | None = None
        self._writing: asyncio.Task[None] | None = None
        self._reports: set[asyncio.Task[None]] = set()
        self._failing = 0
        self._down = False
        self.failures = 0
        """Side-store reads and writes that failed, over this hold's life."""

    def bind(self, side: SideStore, events: EventStore | None = None) -> None:
        """Keep the hold in `side` from now on; a failure of it is reported to `events`."""
        self._side, self._events = side, events
        self._loaded = self._merged = self._down = False

    @property
    def loaded(self) -> bool:
        """Whether the stored hold has been merged in since the last `bind` or failure."""
        return self._loaded

    def get(self, identity: str) -> QuietState:
        """The identity's quiet state as of `as_of` (empty if none)."""
        state = self._states.get(identity)
        if state is None:
            return _NONE
        return state.at(self.as_of) if state.deemed else state

    @property
    def deemed_made(self) -> int:
        """Deemed checks made by `as_of`, over this hold's life."""
        as_of = self.as_of
        states = self._states
        return self._deemed_made + sum(states[i].made(as_of) for i in self._deeming)

    def skip(self, identity: str, now: int, hold_ms: int,
             deemed: tuple[int, ...] = ()) -> QuietState:
        """Count one unchanged check at `now` and hold the identity for `hold_ms`, deeming
        its next checks made at the times `deemed` (ascending, ms: its world is unchanged, so
        each would be a quiet skip too); the new state."""
        old = self.get(identity)
        state = QuietState(old.skips + 1, now, now + hold_ms, deemed)
        self._set(identity, state)
        return state

    def end_deeming(self, identity: str) -> QuietState:
        """Make the deemed checks due by `as_of` and deem no later ones (something about the
        identity changed); the state then."""
        state = self._states.get(identity)
        if state is None:
            return _NONE
        if state.deemed:
            state = msgspec.structs.replace(state.at(self.as_of), deemed=())
            self._set(identity, state)
        return state

    def lift(self, identity: str) -> None:
        """End the identity's hold (its world changed); the skip count stays."""
        old = self.get(identity)
        if old.hold_until or old.deemed:
            self._set(identity, QuietState(old.skips, old.last_check_at, 0))

    def clear(self, identity: str) -> QuietState:
        """Forget the identity's quiet bookkeeping (a review reported it); the state then."""
        self._set(identity, _NONE, cleared=True)
        return _NONE

    def _set(self, identity: str, state: QuietState, *, cleared: bool = False) -> None:
        if not self._loaded:  # remember which states were counted from nothing
            if cleared:
                self._unbased.discard(identity)
            elif identity not in self._states:
                self._unbased.add(identity)
        self._place(identity, state)
        self._dirty.add(identity)

    def _place(self, identity: str, state: QuietState) -> None:
        """Keep `state`, counting the deemed checks its predecessor made."""
        old = self._states.get(identity)
        if old is not None and old.deemed:
            self._deemed_made += old.made(self.as_of)
            self._deeming.discard(identity)
        if state.deemed:
            self._deeming.add(identity)
        self._states[identity] = state

    async def load(self) -> bool:
        """Merge the stored hold in, once after `bind` (and again after a failure); True when
        that happened, here or in the background, since the last call.

        An identity first counted before the load keeps its newer hold, and its skips add to
        the stored ones; one cleared, or known from an earlier load, keeps its state. A failed
        read or write is reported; from then on the store is read again in the background
        (the caller never waits for a store known to fail), and until it answers nothing is
        written, so no stored hold is overwritten. Once it answers, every hold in memory is
        written back with the next `write_behind`.
        """
        side = self._side
        if side is None:
            return False
        if self._merged:
            self._merged = False
            return True
        if self._loaded:
            return False
        if not self._down:
            return await self._read(side)
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._read(side, behind=True),
                                                name="pulse-awareness-quiet-hold-read")
        return False

    async def _read(self, side: SideStore, *, behind: bool = False) -> bool:
        try:
            stored = await side.get_all(NAMESPACE)
        except Exception as exc:
            self._failed(exc, "read")
            return False
        if side is not self._side or self._loaded:
            return False  # bound elsewhere meanwhile: that store is read on its own
        for identity, raw in stored.items():
            try:
                state = _decode(raw)
            except msgspec.DecodeError:
                continue  # an unreadable entry is no hold: one more check
            mine = self._states.get(identity)
            if mine is None:
                self._place(identity, state)
                self._deemed_made -= state.made(self.as_of)  # made by whoever stored them
            elif identity in self._unbased:
                theirs, ours = state.at(self.as_of), mine.at(self.as_of)
                self._place(identity, QuietState(
                    theirs.skips + ours.skips, max(theirs.last_check_at, ours.last_check_at),
                    ours.hold_until, ours.deemed))
        self._unbased.clear()
        self._loaded = True
        self._merged = behind
        if self._failing:
            self._restored()
        return True

    def write_behind(self) -> None:
        """Start writing every changed state in one `put`, unless one is still in flight (the
        changes then wait for the next call) or the stored hold is not loaded yet."""
        side = self._side
        if side is None or not self._loaded or not self._dirty:
            return
        if self._writing is not None and not self._writing.done():
            return
        dirty, self._dirty = self._dirty, set()
        self._writing = asyncio.create_task(self._write(side, dirty),
                                            name="pulse-awareness-quiet-hold")

    async def _write(self, side: SideStore, dirty: set[str]) -> None:
        # read and encoded here, not in the tick that changed them: a state changed since is
        # written in its newer form (and again by the next put)
        states = self._states
        encoded = {identity: _encode(states[identity]) for identity in dirty}
        try:
            await side.put(NAMESPACE, encoded, self.ttl_ms)
        except BaseException as exc:
            self._dirty.update(dirty)  # written again, in its latest state, by the next put
            if not isinstance(exc, Exception):
                raise
            self._failed(exc, "write")

    async def drain(self) -> None:
        """Finish the read and the write in flight, then write what is left, and the reports
        (before the stores close)."""
        if self._reading is not None:
            await self._reading
        if self._writing is not None:
            await self._writing
        self.write_behind()
        if self._writing is not None:
            await self._writing
        while self._reports:
            await asyncio.gather(*self._reports)

    def _failed(self, exc: Exception, doing: str) -> None:
        """Count a failure, and read the store again before writing to it; report the first
        of an outage, in the background."""
        self.failures += 1
        self._failing += 1
        self._down = True
        self._loaded = False  # the store may have lost or changed what it held
        if self._failing > 1:
            return
        self._report(logging.ERROR, error_draft(WHERE, QuietHoldUnavailable(
            f"cannot {doing} the quiet hold in the side store: {type(exc).__name__}: {exc} — "
            "reviews go on without the stored hold (one more check at worst), and once the "
            "store answers it is read again and every change written")))

    def _restored(self) -> None:
        """The store answers again: write every hold back, and say so once."""
        failures, self._failing, self._down = self._failing, 0, False
        self._dirty.update(self._states)
        restored = QuietHoldRestored(
            failures, f"the side store answers again after {failures} failed reads and "
            "writes: the stored hold was read again and every hold in memory is written back")
        self._report(logging.WARNING, EventDraft(RESTORED, WHERE, msgspec.to_builtins(restored),
                                                 origin=WHERE))

    def _report(self, level: int, draft: EventDraft) -> None:
        """Record `draft` in the log, in the background (without one: log it at `level`)."""
        if self._events is None:
            log.log(level, "pulse: %s: %s", WHERE, draft.data)
            return
        report = asyncio.create_task(self._append(self._events, draft),
                                     name="pulse-awareness-quiet-hold-report")
        self._reports.add(report)
        report.add_done_callback(self._reports.discard)

    @staticmethod
    async def _append(events: EventStore, draft: EventDraft) -> None:
        try:
            await events.append([draft])
        except Exception as failed:  # the log is down too: say so where it can be seen
            log.error("pulse: %s: %s (and recording it failed: %s)", WHERE, draft.data, failed)
