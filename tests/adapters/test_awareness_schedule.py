"""The reviewer's incremental schedule picks exactly what a full scan of every identity would:
the same reviews in the same order, the same quiet skips and the same holds, over random
sequences of news, settled and failed reviews, other engines' pending reviews, route health
changes and ticks.

The oracle is the rule as it was before its schedule was kept between ticks: each tick it
diffs every identity's memory and review state against the last tick's, then computes every
identity's due time and takes the due ones in (due, rank, identity) order. With `deem`, a
quiet skip deems the unchanged world's next checks made at their due times, as the rule does;
without it, every check is made at a tick, as the rule did before: the two agree whenever the
ticks come at the due times.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass, field

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from pulse_adapters.awareness import AwarenessConfig, due_at, route_healthy
from pulse_adapters.awareness.effects import AwarenessReview
from pulse_adapters.awareness.fingerprint import fingerprint
from pulse_adapters.awareness.ledger import DAY_MS, LedgerData, ReviewState
from pulse_adapters.awareness.quiet import QuietHold, QuietState
from pulse_adapters.awareness.rule import AwarenessRule
from pulse_adapters.llm import ROUTE_KEY
from pulse_core import Decision, PersistentMap, Sample, Snapshot, VitalReading
from pulse_core.memory import Exchange, IdentityMemory, Observation

PEOPLE = ("ana", "bo", "cy", "di", "ed")
START = 20_000 * DAY_MS + 3_600_000


class FullScan:
    """The oracle: every identity looked at every tick, no state kept but the quiet hold,
    the identities in flight and the last tick's maps."""

    def __init__(self, config: AwarenessConfig, salt_crc: int, *, deem: bool = True) -> None:
        self.config = config
        self.salt_crc = salt_crc
        self.deem = deem
        self.quiet = QuietHold()
        self.in_flight: set[str] = set()
        self.memory: PersistentMap[str, IdentityMemory] | None = None
        self.reviews: PersistentMap[str, ReviewState] | None = None
        self.interval_s: float | None = None
        self.skips = 0

    @property
    def skips_counted(self) -> int:
        return self.skips + self.quiet.deemed_made

    def due(self, curr: Snapshot) -> dict[str, int]:
        """Every identity's due time, those in flight aside."""
        memory: PersistentMap[str, IdentityMemory] = curr.projections["memory"]
        ledger: LedgerData = curr.projections["awareness"]
        interval_s = self.config.healthy_interval_s if route_healthy(curr, self.config) \
            else self.config.fallback_interval_s
        due = {identity: due_at(mem, ledger.identities.get(identity), self.quiet.get(identity),
                                self.config, interval_s)
               for identity, mem in memory.items() if identity not in self.in_flight}
        return {identity: at for identity, at in due.items() if at is not None}

    def tick(self, prev: Snapshot, curr: Snapshot) -> list[AwarenessReview]:
        cfg = self.config
        memory: PersistentMap[str, IdentityMemory] = curr.projections["memory"]
        ledger: LedgerData = curr.projections["awareness"]
        healthy = route_healthy(curr, cfg)
        interval_s = cfg.healthy_interval_s if healthy else cfg.fallback_interval_s
        self.quiet.as_of = prev.at
        if self.memory is None or self.reviews is None or interval_s != self.interval_s:
            changed = set(memory)
        else:
            before, reviews_before = self.memory, self.reviews
            changed = {i for i in memory.keys() | before.keys()
                       if memory.get(i) is not before.get(i)}
            for identity in changed:
                self.quiet.lift(identity)
            changed |= {i for i in ledger.identities.keys() | reviews_before.keys()
                        if ledger.identities.get(i) is not reviews_before.get(i)}
        for identity in list(self.in_flight):
            if f"awareness-review:{identity}" not in curr.pending_effects:
                self.in_flight.discard(identity)
                changed.add(identity)
        for identity in changed:
            self.quiet.end_deeming(identity)
            review = ledger.identities.get(identity)
            quiet = self.quiet.get(identity)
            if review and review.last_outcome == "reviewed" and \
                    review.last_success_at >= quiet.last_check_at and quiet.skips:
                self.quiet.clear(identity)
        self.memory, self.reviews, self.interval_s = memory, ledger.identities, interval_s
        now = self.quiet.as_of = curr.at
        due: list[tuple[int, int, str]] = []
        for identity, mem in memory.items():
            at = due_at(mem, ledger.identities.get(identity), self.quiet.get(identity), cfg,
                        interval_s)
            if identity not in self.in_flight and at is not None and at <= now:
                due.append((at, zlib.crc32(identity.encode(), self.salt_crc), identity))
        picked: list[AwarenessReview] = []
        for _, _, identity in sorted(due):
            if len(picked) >= cfg.max_reviews_per_tick:
                break
            if f"awareness-review:{identity}" in curr.pending_effects:
                self.in_flight.add(identity)
                continue
            review = self.check(identity, memory[identity], ledger, now, interval_s=interval_s,
                                healthy=healthy)
            if review is not None:
                picked.append(review)
                self.in_flight.add(identity)
        return picked

    def check(self, identity: str, memory: IdentityMemory, ledger: LedgerData, now: int, *,
              interval_s: float, healthy: bool) -> AwarenessReview | None:
        cfg = self.config
        human = memory.last_human
        assert human is not None
        review = ledger.identities.get(identity) or ReviewState()
        world = fingerprint(memory)
        unchanged = review.fingerprint == world
        below_ceiling = now - review.last_success_at < cfg.quiet_ceiling_s * 1000
        mine_today = review.calls if review.day == now // DAY_MS else 0
        over_budget = (mine_today >= cfg.calls_per_identity_per_day
                       or ledger.calls_today(now) >= cfg.calls_per_day)
        if (unchanged and below_ceiling) or over_budget:
            hold_ms = int(cfg.quiet_hold_s * 1000)
            state = QuietState(0, now, now + hold_ms)
            deemed: list[int] = []
            while self.deem and unchanged and below_ceiling and len(deemed) < 64:
                at = due_at(memory, ledger.identities.get(identity), state, cfg, interval_s)
                if at is None or at - review.last_success_at >= cfg.quiet_ceiling_s * 1000:
                    break
                deemed.append(at)
                state = QuietState(0, at, at + hold_ms)
            self.quiet.skip(identity, now, hold_ms, tuple(deemed))
            self.skips += 1
            return None
        return AwarenessReview(
            identity=identity, fingerprint=world, source=human.record,
            reason="ceiling" if unchanged else "changed",
            route="dedicated" if healthy else "fallback",
            quiet_skips=self.quiet.get(identity).skips, narration_only=ledger.degraded)


@dataclass
class World:
    """The log's projections as the steps leave them, and the effects still pending."""

    now: int = START
    memory: PersistentMap[str, IdentityMemory] = field(default_factory=PersistentMap)
    ledger: LedgerData = field(default_factory=LedgerData)
    pending: set[str] = field(default_factory=set)
    healthy: bool = True
    made: int = 0

    def say(self, who: str) -> None:
        old = self.memory.get(who) or IdentityMemory(identity=who)
        self.made += 1
        said = Exchange(f"x-{self.made}", "hi", "human", self.now, self.made)
        said_more = msgspec.structs.replace(old, exchanges=(*old.exchanges, said))
        self.memory = self.memory.set(who, said_more)

    def observe(self, who: str, routine: bool) -> None:
        old = self.memory.get(who)
        if old is None:
            return
        self.made += 1
        seen = Observation(f"o-{self.made}", "phone", "battery", self.made, "info", routine,
                           self.now, "watcher")
        self.memory = self.memory.set(who, msgspec.structs.replace(
            old, observations={**old.observations, "battery": seen}, version=old.version + 1))

    def settle(self, who: str, success: bool) -> None:
        """A review of `who` ran and ended (this engine's, if pending, or another's run
        between two ticks)."""
        mem = self.memory.get(who)
        if mem is None or mem.last_human is None:
            return
        self.pending.discard(f"awareness-review:{who}")
        old = self.ledger.identities.get(who) or ReviewState()
        day = self.now // DAY_MS
        calls = (old.calls if old.day == day else 0) + 1
        new = ReviewState(
            last_cycle_at=self.now, last_outcome="reviewed" if success else "failed",
            failures=0 if success else old.failures + 1,
            last_success_at=self.now if success else old.last_success_at,
            reviewed_source=mem.last_human.record if success else old.reviewed_source,
            fingerprint=fingerprint(mem) if success else old.fingerprint, day=day, calls=calls)
        ledger = self.ledger
        self.ledger = LedgerData(
            identities=ledger.identities.set(who, new), day=day,
            calls=(ledger.calls if ledger.day == day else 0) + 1)

    def snapshot(self) -> Snapshot:
        sample = Sample(ROUTE_KEY, self.now, {"ok": self.healthy})
        return Snapshot(seq=self.made, at=self.now, number=self.made,
                        vitals={ROUTE_KEY: VitalReading(sample, 0)},
                        projections={"memory": self.memory, "awareness": self.ledger},
                        pending_effects=frozenset(self.pending))


async def nothing_inside(prev: Snapshot, curr: Snapshot) -> Decision:
    return Decision([], 60_000)


who = st.sampled_from(PEOPLE)
event = st.one_of(
    st.tuples(st.just("say"), who),
    st.tuples(st.just("observe"), who, st.booleans()),
    st.tuples(st.just("settle"), who, st.booleans()),
    st.tuples(st.just("settle pending"), st.booleans()),
    st.tuples(st.just("elsewhere"), who),  # another engine's review of it is pending
    st.tuples(st.just("health"), st.booleans()),
)
rounds = st.lists(st.tuples(  # what happens between two ticks, and the time to the next
    st.lists(event, max_size=3), st.sampled_from([1_000, 30_000, 60_000, 200_000, 1_000_000])),
    min_size=5, max_size=40)
configs = st.builds(
    AwarenessConfig, interval_s=st.sampled_from([30.0, 45.0]),
    fallback_interval_s=st.sampled_from([60.0, 120.0]),
    initial_delay_s=st.sampled_from([5.0, 30.0]), quiet_ceiling_s=st.sampled_from([300.0, 900.0]),
    quiet_hold_s=st.sampled_from([60.0, 200.0]), backoff_base_s=st.sampled_from([10.0, 60.0]),
    backoff_max_s=st.sampled_from([100.0, 600.0]), max_reviews_per_tick=st.integers(1, 4),
    calls_per_identity_per_day=st.integers(0, 4), calls_per_day=st.integers(1, 12))


def happen(world: World, events: list[tuple[object, ...]]) -> None:
    """What a round's `events` do to `world`: someone speaks, an observation, a review settles
    (one, or every pending one), a review pending on another engine, the route's health."""
    for op, *args in events:
        if op == "say":
            world.say(str(args[0]))
        elif op == "observe":
            world.observe(str(args[0]), bool(args[1]))
        elif op == "settle":
            world.settle(str(args[0]), bool(args[1]))
        elif op == "settle pending":
            for key in sorted(world.pending):
                world.settle(key.removeprefix("awareness-review:"), bool(args[0]))
        elif op == "elsewhere":
            world.pending.add(f"awareness-review:{args[0]}")
        else:
            world.healthy = bool(args[0])


@settings(max_examples=300, deadline=None)
@given(config=configs, steps=rounds)
def test_the_kept_schedule_picks_what_a_full_scan_picks(
        config: AwarenessConfig, steps: list[tuple[list[tuple[object, ...]], int]]) -> None:
    rule = AwarenessRule(config)
    oracle = FullScan(config, rule._salt_crc)
    world = World()
    for person in PEOPLE:
        world.say(person)

    async def run() -> None:
        prev = world.snapshot()
        for events, ms in steps:
            happen(world, events)
            world.now += ms
            curr = world.snapshot()
            decision = await rule(prev, curr, nothing_inside)
            expected = oracle.tick(prev, curr)
            assert decision.effects == expected
            assert rule.skips_counted == oracle.skips_counted
            assert {p: rule.quiet.get(p) for p in PEOPLE} == \
                {p: oracle.quiet.get(p) for p in PEOPLE}
            world.pending |= {e.dedup_key() for e in expected}
            prev = curr

    asyncio.run(run())


punctual_event = st.one_of(
    st.tuples(st.just("say"), who),
    st.tuples(st.just("observe"), who, st.booleans()),
    st.tuples(st.just("settle"), who, st.booleans()),
    st.tuples(st.just("settle pending"), st.booleans()),
    st.tuples(st.just("health"), st.booleans()),
)
punctual_rounds = st.lists(st.tuples(
    st.lists(punctual_event, max_size=3),
    st.sampled_from([1_000, 30_000, 60_000, 200_000, 1_000_000])), min_size=5, max_size=60)


def plain(state: QuietState) -> tuple[int, int, int]:
    return state.skips, state.last_check_at, state.hold_until


@settings(max_examples=300, deadline=None)
@given(config=configs, steps=punctual_rounds)
def test_checks_deemed_made_are_the_checks_made_when_ticks_come_at_due_times(
        config: AwarenessConfig, steps: list[tuple[list[tuple[object, ...]], int]]) -> None:
    """An unchanged world's later checks, deemed made at their due times, are the checks the
    rule made one by one before: when a tick comes at every due time (and no tick's cap of
    reviews defers one), the same reviews, the same quiet skips and the same holds."""
    config = msgspec.structs.replace(config, max_reviews_per_tick=len(PEOPLE))
    rule = AwarenessRule(config)
    made = FullScan(config, rule._salt_crc, deem=False)
    world = World()
    for person in PEOPLE:
        world.say(person)

    async def run() -> None:
        prev = world.snapshot()
        for events, ms in steps:
            happen(world, events)
            later = [at for at in made.due(world.snapshot()).values() if at > world.now]
            world.now = min([world.now + ms, *later])
            curr = world.snapshot()
            decision = await rule(prev, curr, nothing_inside)
            expected = made.tick(prev, curr)
            assert decision.effects == expected
            assert rule.skips_counted == made.skips_counted
            assert {p: plain(rule.quiet.get(p)) for p in PEOPLE} == \
                {p: plain(made.quiet.get(p)) for p in PEOPLE}
            world.pending |= {e.dedup_key() for e in expected}
            prev = curr

    asyncio.run(run())
