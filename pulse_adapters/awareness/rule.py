"""The AwarenessRule: fast and deterministic. It reads route health, finds due identities
through a heap, honours the quiet hold, fingerprints the world, and either counts a quiet skip
or emits an `awareness-review` effect. It never waits on a model, nor on a side-store write."""

from __future__ import annotations

import heapq
import os
import zlib
from typing import ClassVar

from pulse_adapters.awareness.config import INTERVAL_FLOOR_S, AwarenessConfig
from pulse_adapters.awareness.effects import AwarenessReview
from pulse_adapters.awareness.fingerprint import fingerprint
from pulse_adapters.awareness.ledger import DAY_MS, AwarenessLedger, LedgerData, ReviewState
from pulse_adapters.awareness.quiet import QuietHold, QuietState
from pulse_adapters.llm import ROUTE_KEY
from pulse_core import Backoff, Decision, Effect, Inner, Memory, PersistentMap, Snapshot
from pulse_core.memory import IdentityMemory


def route_healthy(snapshot: Snapshot, config: AwarenessConfig, route_key: str = ROUTE_KEY) -> bool:
    """A recent, successful probe of the route (vitals `route_key`); health is never
    assumed."""
    reading = snapshot.vital(route_key)
    if reading is None or not reading.sample.ok or reading.age_ms > config.route_stale_s * 1000:
        return False
    data = reading.sample.data
    return isinstance(data, dict) and bool(data.get("ok"))


def due_at(memory: IdentityMemory, review: ReviewState | None, quiet: QuietState,
           config: AwarenessConfig, interval_s: float) -> int | None:
    """When the identity is next due (ms), or None if it has no human exchange yet.

    After a newer human event: its time plus the initial delay; otherwise the last check plus
    the interval; failed or preempted cycles add exponential backoff; a quiet hold defers.
    """
    human = memory.last_human
    if human is None:
        return None
    failures = review.failures if review else 0
    backoff_ms = 0
    if failures:
        backoff_ms = Backoff(initial_ms=int(config.backoff_base_s * 1000), factor=2.0,
                             max_ms=int(config.backoff_max_s * 1000), jitter=0.0
                             ).delay_ms(failures)
    if review is None or review.reviewed_source != human.record:
        base = human.ts + int(config.initial_delay_s * 1000)
        if review is not None and failures:
            base = max(base, review.last_cycle_at)
    else:
        base = max(review.last_cycle_at, quiet.last_check_at) + int(interval_s * 1000)
    due = max(base + backoff_ms, quiet.hold_until)
    if review is not None and review.last_success_at and not failures:
        ceiling_at = review.last_success_at + int(config.quiet_ceiling_s * 1000)
        if ceiling_at > quiet.last_check_at:
            due = min(due, ceiling_at)  # neither a hold nor the interval outlasts the ceiling
            due = max(due, review.last_cycle_at + int(INTERVAL_FLOOR_S * 1000))
    return due


_NO_REVIEW = ReviewState()


class AwarenessRule:
    """The inner awareness rule. Decorates: runs the rules inside it, then adds reviews.

    `quiet` keeps the quiet hold; bound to a side store, the rule loads it at its first tick
    and writes it behind at the end of each tick. An identity whose review is pending (this
    engine's or another's sharing the log) waits for it; equally due identities come off in
    an order of this rule's own, so engines ticking at the same moment rarely pick the same.
    """

    name = "awareness"
    emits: ClassVar[tuple[type[Effect], ...]] = (AwarenessReview,)

    def __init__(self, config: AwarenessConfig | None = None,
                 quiet: QuietHold | None = None, *, route_key: str = ROUTE_KEY) -> None:
        self.config = config or AwarenessConfig()
        self.route_key = route_key
        self.quiet = quiet or QuietHold()
        self._heap: list[tuple[int, int, str]] = []
        # engines sharing a log take equally due ones in other orders
        self._salt_crc = zlib.crc32(os.urandom(8))
        self._ranks: dict[str, int] = {}
        self._due: dict[str, int] = {}
        self._in_flight: set[str] = set()
        self._memory: PersistentMap[str, IdentityMemory] | None = None
        self._reviews: PersistentMap[str, ReviewState] | None = None
        self._interval_s: float | None = None
        self._fingerprints: dict[str, tuple[IdentityMemory, str]] = {}
        self.skips_counted = 0

    def _schedule(self, identity: str, memory: PersistentMap[str, IdentityMemory],
                  ledger: LedgerData, interval_s: float) -> None:
        mem = memory.get(identity)
        due = None if mem is None else due_at(mem, ledger.identities.get(identity),
                                              self.quiet.get(identity), self.config, interval_s)
        self._push(identity, due)

    def _push(self, identity: str, due: int | None) -> None:
        """Put the identity in the heap at `due` (None: out of it)."""
        if due is None:
            self._due.pop(identity, None)
            return
        self._due[identity] = due
        rank = self._ranks.get(identity)
        if rank is None:
            rank = self._ranks[identity] = zlib.crc32(identity.encode(), self._salt_crc)
        heapq.heappush(self._heap, (due, rank, identity))

    def _refresh(self, curr: Snapshot, memory: PersistentMap[str, IdentityMemory],
                 ledger: LedgerData, interval_s: float) -> None:
        if self._memory is None or self._reviews is None or interval_s != self._interval_s:
            changed: set[str] = set(memory)
            self._heap, self._due = [], {}
        else:
            changed = memory.changed_keys(self._memory)
            for identity in changed:  # a hold is for unchanged worlds: news lifts it
                self.quiet.lift(identity)
            changed |= ledger.identities.changed_keys(self._reviews)
        for identity in list(self._in_flight):
            if f"awareness-review:{identity}" not in curr.pending_effects:
                self._in_flight.discard(identity)
                changed.add(identity)
        for identity in changed:
            review = ledger.identities.get(identity)
            quiet = self.quiet.get(identity)
            if review and review.last_outcome == "reviewed" and \
                    review.last_success_at >= quiet.last_check_at and quiet.skips:
                self.quiet.clear(identity)  # success clears quiet bookkeeping
            if identity not in self._in_flight:
                self._schedule(identity, memory, ledger, interval_s)
        self._memory, self._reviews, self._interval_s = memory, ledger.identities, interval_s

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        if not {Memory.name, AwarenessLedger.name} <= curr.projections.keys():
            return Decision(effects, tick_ms)  # a snapshot from an engine without the layer
        memory = curr.state(Memory)
        ledger = curr.state(AwarenessLedger)
        if await self.quiet.load():
            self._memory = None  # the stored hold came in: schedule everyone again
        cfg = self.config
        healthy = route_healthy(curr, cfg, self.route_key)
        interval_s = cfg.healthy_interval_s if healthy else cfg.fallback_interval_s
        self._refresh(curr, memory, ledger, interval_s)
        reviews: list[Effect] = []
        now = curr.at
        heap, due_of, pending = self._heap, self._due, curr.pending_effects
        calls_today = ledger.calls_today(now)
        while heap and heap[0][0] <= now and len(reviews) < cfg.max_reviews_per_tick:
            due, _, identity = heapq.heappop(heap)
            if due_of.get(identity) != due:
                continue  # a stale heap entry: the identity was rescheduled
            del due_of[identity]
            if f"awareness-review:{identity}" in pending:
                self._in_flight.add(identity)  # another engine's review of it is under way
                continue
            mem = memory[identity]
            state = ledger.identities.get(identity)
            review = self._check(identity, mem, state, ledger, now=now, healthy=healthy,
                                 calls_today=calls_today)
            if review is None:
                self._push(identity, due_at(mem, state, self.quiet.get(identity), cfg,
                                            interval_s))
            else:
                reviews.append(review)
                self._in_flight.add(identity)
        self.quiet.write_behind()
        if self._heap:
            tick_ms = min(tick_ms, max(1_000, self._heap[0][0] - now))
        return Decision([*effects, *reviews], tick_ms)

    def _check(self, identity: str, memory: IdentityMemory, state: ReviewState | None,
               ledger: LedgerData, *, now: int, healthy: bool, calls_today: int
               ) -> AwarenessReview | None:
        """A review to run now, or None after counting a quiet (or budget) skip; `state` is
        the identity's review state, `calls_today` the model calls made today over all."""
        cfg = self.config
        human = memory.last_human
        if human is None:
            return None
        review = state or _NO_REVIEW
        quiet = self.quiet.get(identity)
        cached = self._fingerprints.get(identity)
        if cached is not None and cached[0] is memory:
            world = cached[1]
        else:
            world = fingerprint(memory)
            self._fingerprints[identity] = (memory, world)
        unchanged = review.fingerprint == world
        below_ceiling = now - review.last_success_at < cfg.quiet_ceiling_s * 1000
        mine_today = review.calls if review.day == now // DAY_MS else 0
        over_budget = (mine_today >= cfg.calls_per_identity_per_day
                       or calls_today >= cfg.calls_per_day)
        if (unchanged and below_ceiling) or over_budget:
            self.quiet.skip(identity, now, int(cfg.quiet_hold_s * 1000))
            self.skips_counted += 1
            return None
        return AwarenessReview(
            identity=identity, fingerprint=world, source=human.record,
            reason="ceiling" if unchanged else "changed",
            route="dedicated" if healthy else "fallback", quiet_skips=quiet.skips,
            narration_only=ledger.degraded)
