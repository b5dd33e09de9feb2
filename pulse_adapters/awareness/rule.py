"""The AwarenessRule: fast and deterministic. It reads route health, finds due identities
through a heap, honours the quiet hold, fingerprints the world, and either counts a quiet skip
or emits an `awareness-review` effect. It never waits on a model, nor on a side-store write."""

from __future__ import annotations

import heapq
import math
import os
import zlib
from typing import ClassVar

import msgspec

from pulse_adapters.awareness.config import INTERVAL_FLOOR_S, AwarenessConfig
from pulse_adapters.awareness.effects import AwarenessReview
from pulse_adapters.awareness.fingerprint import fingerprint
from pulse_adapters.awareness.ledger import DAY_MS, AwarenessLedger, LedgerData, ReviewState
from pulse_adapters.awareness.quiet import QuietHold, QuietState
from pulse_adapters.llm import ROUTE_KEY
from pulse_core import Backoff, Decision, Effect, Inner, Memory, PersistentMap, Snapshot
from pulse_core.memory import Exchange, IdentityMemory

_FLOOR_MS = int(INTERVAL_FLOOR_S * 1000)
_DEEMED = 64
"""The most checks deemed made after one quiet skip (then one is made, and deems more)."""


def route_healthy(snapshot: Snapshot, config: AwarenessConfig, route_key: str = ROUTE_KEY) -> bool:
    """A recent, successful probe of the route (vitals `route_key`); health is never
    assumed."""
    reading = snapshot.vital(route_key)
    if reading is None or not reading.sample.ok or reading.age_ms > config.route_stale_s * 1000:
        return False
    data = reading.sample.data
    return isinstance(data, dict) and bool(data.get("ok"))


class _Cadence(msgspec.Struct, frozen=True, gc=False):
    """The config's times the due time is made of, in ms, worked out once per config."""

    initial_delay_ms: int
    ceiling_ms: int
    backoff: Backoff

    @classmethod
    def of(cls, config: AwarenessConfig) -> _Cadence:
        return cls(int(config.initial_delay_s * 1000), int(config.quiet_ceiling_s * 1000),
                   Backoff(initial_ms=int(config.backoff_base_s * 1000), factor=2.0,
                           max_ms=int(config.backoff_max_s * 1000), jitter=0.0))


def due_at(memory: IdentityMemory, review: ReviewState | None, quiet: QuietState,
           config: AwarenessConfig, interval_s: float) -> int | None:
    """When the identity is next due (ms), or None if it has no human exchange yet.

    After a newer human event: its time plus the initial delay; otherwise the last check plus
    the interval; failed or preempted cycles add exponential backoff; a quiet hold defers.
    """
    return _due(memory.last_human, review, quiet, _Cadence.of(config), int(interval_s * 1000))


def _due(human: Exchange | None, review: ReviewState | None, quiet: QuietState,
         cadence: _Cadence, interval_ms: int) -> int | None:
    """`due_at` from the identity's newest human exchange and the cadence in ms."""
    return None if human is None else _due_after(human, review, quiet, cadence, interval_ms)


def _due_after(human: Exchange, review: ReviewState | None, quiet: QuietState,
               cadence: _Cadence, interval_ms: int) -> int:
    """`_due` of an identity with a human exchange."""
    failures = review.failures if review else 0
    backoff_ms = cadence.backoff.delay_ms(failures) if failures else 0
    if review is None or review.reviewed_source != human.record:
        base = human.ts + cadence.initial_delay_ms
        if review is not None and failures and review.last_cycle_at > base:
            base = review.last_cycle_at
    else:
        last = review.last_cycle_at
        base = (last if last > quiet.last_check_at else quiet.last_check_at) + interval_ms
    due = max(base + backoff_ms, quiet.hold_until)
    if review is not None and review.last_success_at and not failures:
        ceiling_at = review.last_success_at + cadence.ceiling_ms
        if ceiling_at > quiet.last_check_at:
            # neither a hold nor the interval outlasts the ceiling, nor the floor
            due = max(min(due, ceiling_at), review.last_cycle_at + _FLOOR_MS)
    return due


def _deemed_checks(human: Exchange, review: ReviewState, at: int,
                   tick: _Tick) -> tuple[tuple[int, ...], int]:
    """The due times of the checks after a quiet skip, the first due at `at`, that are quiet
    skips too for an unchanged world (below its ceiling; `_DEEMED` at most), and the due
    time of the check after them."""
    cadence, interval_ms, hold_ms, ceiling_ms = \
        tick.cadence, tick.interval_ms, tick.hold_ms, tick.ceiling_ms
    failures, last_cycle, last_success = \
        review.failures, review.last_cycle_at, review.last_success_at
    # from a check at `at` past the last cycle, `_due_after` is `at + step` for a reviewed
    # source, unless the ceiling or the floor after the last cycle comes between
    steady = review.reviewed_source == human.record
    step = max(interval_ms + (cadence.backoff.delay_ms(failures) if failures else 0), hold_ms)
    clamped = bool(last_success) and not failures
    ceiling_at, floor_at = last_success + cadence.ceiling_ms, last_cycle + _FLOOR_MS
    deemed: list[int] = []
    if steady and step > 0 and at >= last_cycle and floor_at <= at + step:
        # the checks from `at` on come `step` apart, each below the ceiling, while the next
        # stays within it (clamped): those are taken at once, the rest one by one below
        stop = last_success + math.ceil(ceiling_ms)
        if clamped:
            stop = min(stop, ceiling_at - step + 1)
        run = range(at, stop, step)[:_DEEMED]
        if run:
            deemed.extend(run)
            at = run[-1] + step
    while at - last_success < ceiling_ms and len(deemed) < _DEEMED:
        deemed.append(at)
        after = at + step
        if steady and at >= last_cycle and \
                (not clamped or ceiling_at <= at or floor_at <= after <= ceiling_at):
            at = after
        else:
            at = _due_after(human, review, QuietState(0, at, at + hold_ms), cadence,
                            interval_ms)
    return tuple(deemed), at


class _Watched:
    """What the rule keeps of one identity between its changes: the memory and review state
    it was last scheduled from (so a due check reads no map), their newest human exchange,
    the world's fingerprint once taken, its tie-breaking rank and its due time."""

    __slots__ = ("due", "human", "memory", "rank", "review", "review_key", "world")

    def __init__(self, identity: str, rank: int) -> None:
        self.rank = rank
        self.review_key = f"awareness-review:{identity}"
        self.memory: IdentityMemory | None = None
        self.review: ReviewState | None = None
        self.human: Exchange | None = None
        self.world: str | None = None
        self.due: int | None = None

    def saw(self, memory: IdentityMemory, review: ReviewState | None) -> None:
        if memory is not self.memory:
            self.memory, self.human, self.world = memory, memory.last_human, None
        self.review = review


class _Tick(msgspec.Struct, frozen=True, gc=False):
    """What every due check of one tick shares, worked out once for the tick."""

    now: int
    today: int
    interval_ms: int
    cadence: _Cadence
    ceiling_ms: float
    hold_ms: int
    out_of_calls: bool
    calls_per_identity: int
    route: str
    degraded: bool
    pending: frozenset[str]


_NO_REVIEW = ReviewState()


class AwarenessRule:
    """The inner awareness rule. Decorates: runs the rules inside it, then adds reviews.

    `quiet` keeps the quiet hold; bound to a side store, the rule loads it at its first tick
    and writes it behind at the end of each tick. An identity whose review is pending (this
    engine's or another's sharing the log) waits for it; equally due identities come off in
    an order of this rule's own, so engines ticking at the same moment rarely pick the same.

    A tick touches only the identities that changed since the last one (found by diffing the
    persistent maps) and those due: each waits at its due time (the times in a heap, the
    identities due at one in a list), rescheduled when its memory, review state or quiet hold
    changes. A quiet skip deems the unchanged world's next checks made at their due times
    (`QuietState.deemed`), so the identity waits for its ceiling, not for each hold's end.
    """

    name = "awareness"
    emits: ClassVar[tuple[type[Effect], ...]] = (AwarenessReview,)

    def __init__(self, config: AwarenessConfig | None = None,
                 quiet: QuietHold | None = None, *, route_key: str = ROUTE_KEY) -> None:
        self.config = config or AwarenessConfig()
        self.route_key = route_key
        self.quiet = quiet or QuietHold()
        # the schedule: each due time once in a heap, and the identities due at it, by rank
        self._times: list[int] = []
        self._slots: dict[int, list[tuple[int, str]]] = {}
        # engines sharing a log take equally due ones in other orders
        self._salt_crc = zlib.crc32(os.urandom(8))
        self._watched: dict[str, _Watched] = {}
        self._in_flight: set[str] = set()
        self._memory: PersistentMap[str, IdentityMemory] | None = None
        self._reviews: PersistentMap[str, ReviewState] | None = None
        self._interval_s: float | None = None
        self._cadence: tuple[AwarenessConfig, _Cadence] | None = None
        self._skips = 0

    @property
    def skips_counted(self) -> int:
        """Quiet (and budget) skips counted so far: the checks made and the checks deemed."""
        return self._skips + self.quiet.deemed_made

    def _cadence_of(self, config: AwarenessConfig) -> _Cadence:
        if self._cadence is None or self._cadence[0] is not config:
            self._cadence = (config, _Cadence.of(config))
        return self._cadence[1]

    def _schedule(self, identity: str, mem: IdentityMemory | None, review: ReviewState | None,
                  quiet: QuietState, *, interval_ms: int, cadence: _Cadence) -> None:
        if mem is None:
            watched = self._watched.pop(identity, None)
            if watched is not None:
                watched.due = None
            return
        watched = self._watched.get(identity)
        if watched is None:
            watched = self._watched[identity] = _Watched(
                identity, zlib.crc32(identity.encode(), self._salt_crc))
        watched.saw(mem, review)
        self._push(identity, watched, _due(watched.human, review, quiet, cadence, interval_ms))

    def _push(self, identity: str, watched: _Watched, due: int | None) -> None:
        """Put the identity in the schedule at `due` (None: out of it)."""
        watched.due = due
        if due is None:
            return
        slot = self._slots.get(due)
        if slot is None:
            self._slots[due] = [(watched.rank, identity)]
            heapq.heappush(self._times, due)
        else:
            slot.append((watched.rank, identity))

    def _refresh(self, curr: Snapshot, memory: PersistentMap[str, IdentityMemory],
                 ledger: LedgerData, interval_s: float, cadence: _Cadence) -> None:
        if self._memory is None or self._reviews is None or interval_s != self._interval_s:
            changed: set[str] = set(memory)
            self._times, self._slots = [], {}
            for watched in self._watched.values():
                watched.due = None
        else:
            changed = memory.changed_keys(self._memory)
            for identity in changed:  # a hold is for unchanged worlds: news lifts it
                self.quiet.lift(identity)
            changed |= ledger.identities.changed_keys(self._reviews)
        for identity in list(self._in_flight):
            if f"awareness-review:{identity}" not in curr.pending_effects:
                self._in_flight.discard(identity)
                changed.add(identity)
        interval_ms = int(interval_s * 1000)
        hold, reviews, in_flight = self.quiet, ledger.identities, self._in_flight
        for identity in changed:
            review = reviews.get(identity)
            quiet = hold.get(identity)
            if review and review.last_outcome == "reviewed" and \
                    review.last_success_at >= quiet.last_check_at and quiet.skips:
                quiet = hold.clear(identity)  # success clears quiet bookkeeping
            else:
                quiet = hold.end_deeming(identity)  # deemed from what has just changed
            if identity not in in_flight:
                self._schedule(identity, memory.get(identity), review, quiet,
                               interval_ms=interval_ms, cadence=cadence)
        self._memory, self._reviews, self._interval_s = memory, ledger.identities, interval_s

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        if not {Memory.name, AwarenessLedger.name} <= curr.projections.keys():
            return Decision(effects, tick_ms)  # a snapshot from an engine without the layer
        memory = curr.state(Memory)
        ledger = curr.state(AwarenessLedger)
        self.quiet.as_of = prev.at  # what changed since is seen as of the last tick
        if await self.quiet.load():
            self._memory = None  # the stored hold came in: schedule everyone again
        cfg = self.config
        cadence = self._cadence_of(cfg)
        healthy = route_healthy(curr, cfg, self.route_key)
        interval_s = cfg.healthy_interval_s if healthy else cfg.fallback_interval_s
        interval_ms = int(interval_s * 1000)
        self._refresh(curr, memory, ledger, interval_s, cadence)
        self.quiet.as_of = curr.at
        reviews = self._check_due(curr, ledger, healthy, interval_ms, cadence)
        self.quiet.write_behind()
        if self._times:
            tick_ms = min(tick_ms, max(1_000, self._times[0] - curr.at))
        return Decision([*effects, *reviews], tick_ms)

    def _check_due(self, curr: Snapshot, ledger: LedgerData, healthy: bool, interval_ms: int,
                   cadence: _Cadence) -> list[Effect]:
        """Check every identity due by `curr.at`, in (due, rank, name) order, until the tick's
        cap of reviews; the reviews asked for."""
        cfg = self.config
        now = curr.at
        tick = _Tick(now=now, today=now // DAY_MS, interval_ms=interval_ms, cadence=cadence,
                     ceiling_ms=cfg.quiet_ceiling_s * 1000, hold_ms=int(cfg.quiet_hold_s * 1000),
                     out_of_calls=ledger.calls_today(now) >= cfg.calls_per_day,
                     calls_per_identity=cfg.calls_per_identity_per_day,
                     route="dedicated" if healthy else "fallback", degraded=ledger.degraded,
                     pending=curr.pending_effects)
        times, slots = self._times, self._slots
        cap = cfg.max_reviews_per_tick
        reviews: list[Effect] = []
        while times and times[0] <= now and len(reviews) < cap:
            due = times[0]
            slot = slots[due]
            slot.sort()  # equally due ones in rank order, then by name
            taken = self._check_slot(due, slot, tick, reviews, cap)
            if taken < len(slot):
                del slot[:taken]
            else:
                heapq.heappop(times)
                del slots[due]
        return reviews

    def _check_slot(self, due: int, slot: list[tuple[int, str]], tick: _Tick,
                    reviews: list[Effect], cap: int) -> int:
        """Check the identities due at `due`, in order, until `reviews` holds `cap`: each
        either counts a quiet (or budget) skip and is scheduled for its next check, or is
        asked for a review (and waits for it). How many entries of `slot` were taken."""
        now, ceiling_ms, hold_ms = tick.now, tick.ceiling_ms, tick.hold_ms
        today, out_of_calls, per_identity = tick.today, tick.out_of_calls, tick.calls_per_identity
        cadence, interval_ms, pending = tick.cadence, tick.interval_ms, tick.pending
        skip, times, slots, watching = self.quiet.skip, self._times, self._slots, self._watched
        in_flight = self._in_flight
        room = cap - len(reviews)
        taken = skips = 0
        for _, identity in slot:
            if room <= 0:
                break
            taken += 1
            watched = watching.get(identity)
            if watched is None or watched.due != due:
                continue  # a stale entry: the identity was rescheduled
            watched.due = None
            if watched.review_key in pending:
                in_flight.add(identity)  # another engine's review of it is under way
                continue
            human, memory = watched.human, watched.memory
            if human is None or memory is None:
                continue
            review = watched.review or _NO_REVIEW
            world = watched.world
            if world is None:
                world = watched.world = fingerprint(memory)
            unchanged = review.fingerprint == world
            quiet_skip = unchanged and now - review.last_success_at < ceiling_ms
            if quiet_skip or out_of_calls \
                    or (review.calls if review.day == today else 0) >= per_identity:
                skips += 1  # held, and scheduled for its next check at once
                if quiet_skip:  # and the unchanged world's next checks deemed made
                    at = _due_after(human, review, QuietState(0, now, now + hold_ms), cadence,
                                    interval_ms)
                    deemed, at = _deemed_checks(human, review, at, tick)
                    skip(identity, now, hold_ms, deemed)
                else:
                    at = _due_after(human, watched.review, skip(identity, now, hold_ms),
                                    cadence, interval_ms)
                watched.due = at
                then = slots.get(at)
                if then is None:
                    slots[at] = [(watched.rank, identity)]
                    heapq.heappush(times, at)
                else:
                    then.append((watched.rank, identity))
                continue
            reviews.append(AwarenessReview(
                identity=identity, fingerprint=world, source=human.record,
                reason="ceiling" if unchanged else "changed", route=tick.route,
                quiet_skips=self.quiet.get(identity).skips, narration_only=tick.degraded))
            room -= 1
            in_flight.add(identity)
        self._skips += skips
        return taken
