"""The awareness reviewer over unchanged worlds: an unchanged world costs only ceiling checkpoints.

    python -m bench.awareness [--identities 10000] [--hours 24] [--step-s 30] [--spread-s 300]

A real Engine on a temporary home, driven by a ManualClock in `--step-s` steps (one
`engine.tick()` a step) for `--hours` simulated hours, running the `awareness` layer built from
AwarenessSettings (its rule wrapped to be timed; the quiet hold in the home's side store,
state.db, bound as the layer's service binds it); its executor never runs. Each identity gets one
human exchange and `--observations` routine observations, their arrival spread over the first
`--spread-s` seconds, and nothing else ever happens to it. A route-health sample
("llm-route", {"ok": True}) is written every step, so the fast cadence applies.

No model is asked: every `awareness-review` effect the rule emits is counted as one model call
and settled at once with what a successful review would write: the executor loop's claim
(`effect-executing`), the `awareness-cycle` record (outcome "reviewed", fingerprint and source
from the effect, model_calls=1, origin "executor:awareness") and `effect-acked`.

Reports, each beside the limit it is judged against:
- model calls vs the quiet-ceiling floor: per identity, the first review (its world is new),
  then exactly one per `quiet_ceiling_s` — the expectation is computed per identity from its
  exchange time, on the tick grid;
- the longest gap between two reviews of one identity vs `quiet_ceiling_s` (+ one step);
- quiet skips (`rule.skips_counted`) vs one check per identity per `quiet_hold_s`;
- events written per simulated hour vs the events the reviews account for (skips write none);
- the AwarenessRule's own time per tick (a wrapper rule just outside it, minus the inner
  chain), p50 and p99, beside a bare heapq push+pop of `--identities` items and an empty tick
  of the same engine with the awareness rule switched off (measured after the run).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import heapq
import math
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from bench.common import Figure, Floor, Report, fmt, median, percentile, temp_dir
from pulse_adapters.awareness import (
    AwarenessConfig,
    AwarenessSettings,
    CycleRecord,
    build_reviewer,
)
from pulse_adapters.awareness.executor import ORIGIN
from pulse_adapters.llm import ROUTE_KEY
from pulse_core import (
    Decision,
    Engine,
    EventDraft,
    HomeLayout,
    Inner,
    LayerContext,
    ManualClock,
    SideStore,
    Snapshot,
    identity_key,
)
from pulse_core.memory import HumanExchange, IdentityRegistered, ObservationRecorded

START_MS = 1_700_000_000_000
LOOP_ORIGIN = "executor:AwarenessExecutor"  # what the ExecutorLoop writes for that executor
REVIEW = "awareness-review"
PER_REVIEW = ("effect", "effect-executing", "awareness-cycle", "effect-acked")


class TimedRule:
    """Wraps a rule and records its own time per tick: the call minus the inner chain, by
    the wall clock (`samples`) and by the CPU time of the loop's thread (`cpu`: what a
    machine busy with other work does not add). With `enabled` False it passes straight
    through (the rule is switched off)."""

    name = "awareness-timed"

    def __init__(self, rule: Any) -> None:
        self.rule = rule
        self.enabled = True
        self.samples: list[float] = []
        self.cpu: list[float] = []

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        if not self.enabled:
            return await inner(prev, curr)
        inside = inside_cpu = 0.0

        async def timed_inner(p: Snapshot, c: Snapshot) -> Decision:
            nonlocal inside, inside_cpu
            started, started_cpu = time.perf_counter(), time.thread_time()
            try:
                return await inner(p, c)
            finally:
                inside += time.perf_counter() - started
                inside_cpu += time.thread_time() - started_cpu

        started, started_cpu = time.perf_counter(), time.thread_time()
        decision: Decision = await self.rule(prev, curr, timed_inner)
        self.samples.append(time.perf_counter() - started - inside)
        self.cpu.append(time.thread_time() - started_cpu - inside_cpu)
        return decision


class TimedSideStore:
    """The engine's side store, timing each `put` (the quiet hold's one write behind a tick)."""

    def __init__(self, inner: SideStore) -> None:
        self.inner = inner
        self.puts: list[float] = []

    async def get_all(self, namespace: str) -> dict[str, bytes]:
        return await self.inner.get_all(namespace)

    async def put(self, namespace: str, items: Mapping[str, bytes],
                  ttl_ms: int | None = None) -> None:
        started = time.perf_counter()
        await self.inner.put(namespace, items, ttl_ms)
        self.puts.append(time.perf_counter() - started)

    async def delete(self, namespace: str, keys: Iterable[str]) -> None:
        await self.inner.delete(namespace, keys)

    async def close(self) -> None:
        await self.inner.close()


def identity_drafts(index: int, observations: int) -> list[EventDraft]:
    """One identity: registered, one human exchange, `observations` routine observations."""
    ident = f"id-{index:06d}"
    key = identity_key(ident)
    drafts = [
        EventDraft("identity-registered", key,
                   msgspec.to_builtins(IdentityRegistered(f"person {index}"))),
        EventDraft("human-exchange", key, msgspec.to_builtins(HumanExchange(
            record=f"x-{index:06d}", text="see you tomorrow", role="human")), origin="human"),
    ]
    sensors: list[tuple[str, str, Any]] = [
        ("phone", "battery", {"pct": 40 + index % 60, "charging": False}),
        ("home", "door", {"open": False, "checked": "2026-01-01T09:00:00Z"}),
        ("watch", "steps", 3_000 + index % 5_000),
        ("weather", "sky", "clear"),
    ]
    for n in range(observations):
        source, name, value = sensors[n % len(sensors)]
        drafts.append(EventDraft("observation-recorded", key, msgspec.to_builtins(
            ObservationRecorded(record=f"o-{index:06d}-{n}", source=source, key=f"{name}{n}",
                                value=value))))
    return drafts


def settle_drafts(effect_event: Any) -> list[EventDraft]:
    """What a successful review of this effect writes: the claim, the cycle record, the ack."""
    body = effect_event.data["effect"]
    key = effect_event.key
    cause = effect_event.seq
    record = CycleRecord(
        identity=body["identity"], outcome="reviewed", reason=body["reason"],
        route=body["route"], model="simulated", model_calls=1, inference_ms=0,
        quiet_skips=body.get("quiet_skips", 0), fingerprint=body["fingerprint"],
        source=body["source"], narration_only=body.get("narration_only", False),
        narration="I noticed nothing new.")
    return [
        EventDraft("effect-executing", key, {"attempt": 1, "lease_until": 0, "owner": "bench",
                                             "pid": os.getpid(), "started": 0.0},
                   origin=LOOP_ORIGIN, cause=cause),
        EventDraft("awareness-cycle", identity_key(body["identity"]),
                   msgspec.to_builtins(record), origin=ORIGIN, cause=cause),
        EventDraft("effect-acked", key, {"attempt": 1, "result": {"outcome": "reviewed"},
                                         "duration_ms": 0}, origin=LOOP_ORIGIN, cause=cause),
    ]


def expected_reviews(exchange_ms: int, end_ms: int, config: AwarenessConfig,
                     step_ms: int) -> tuple[int, int]:
    """(reviews, ceiling checkpoints) an unchanged world owes from one exchange up to `end_ms`:
    the first review at the first tick at or after exchange + initial delay, then one at the
    first tick at or after each previous review + quiet_ceiling_s."""

    def on_grid(at: int) -> int:
        return START_MS + math.ceil((at - START_MS) / step_ms) * step_ms

    review = on_grid(exchange_ms + int(config.initial_delay_s * 1000))
    if review > end_ms:
        return 0, 0
    count = 1
    while True:
        review = on_grid(review + int(config.quiet_ceiling_s * 1000))
        if review > end_ms:
            return count, count - 1
        count += 1


def heapq_limit(items: int, repeats: int = 5) -> float:
    """Seconds for a bare heapq push of `items` (due, key) pairs and popping them all, median."""
    entries = [((i * 7_919) % items, f"id-{i:06d}") for i in range(items)]
    times: list[float] = []
    for _ in range(repeats):
        heap: list[tuple[int, str]] = []
        started = time.perf_counter()
        for entry in entries:
            heapq.heappush(heap, entry)
        while heap:
            heapq.heappop(heap)
        times.append(time.perf_counter() - started)
    return median(times)


def events_by_kind(path: Path, after_seq: int) -> Counter[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return Counter(dict(conn.execute(
            "SELECT kind, count(*) FROM events WHERE seq > ? GROUP BY kind", (after_seq,))))
    finally:
        conn.close()


class Result:
    """What one simulated run measured."""

    def __init__(self) -> None:
        self.reviews = 0
        self.reasons: Counter[str] = Counter()
        self.carried_skips = 0
        self.other_effects: Counter[str] = Counter()
        self.expected = 0
        self.expected_ceiling = 0
        self.max_gap_ms = 0
        self.skips = 0
        self.deemed = 0
        self.trailing_skips = 0
        self.kinds: Counter[str] = Counter()
        self.setup_events = 0
        self.review_ticks = 0
        self.ticks = 0
        self.rule: list[float] = []
        self.rule_cpu: list[float] = []
        self.tick: list[float] = []
        self.empty_tick: list[float] = []
        self.put: list[float] = []
        self.wall_s = 0.0


class Simulation:
    """One engine on one home, its clock, the wrapped rule, and what the run measured."""

    def __init__(self, home: Path, args: argparse.Namespace, config: AwarenessConfig) -> None:
        self.args = args
        self.config = config
        self.result = Result()
        self.step_ms = int(args.step_s * 1000)
        self.slots = max(1, math.ceil(args.spread_s / args.step_s))
        self.end_ms = START_MS + int(args.hours * 3_600_000)
        self.clock = ManualClock(START_MS)
        self.db = HomeLayout.at(home).events_db
        settings = AwarenessSettings(base_url="http://127.0.0.1:9/v1", model="simulated",
                                     review=config)
        self.reviewer = build_reviewer(settings, LayerContext(home, self.clock))
        self.quiet = self.reviewer.quiet
        self.rule = self.reviewer.rule
        self.timed = TimedRule(self.rule)
        timed_layer = dataclasses.replace(self.reviewer.layer, rules=(self.timed,))
        self.engine = Engine(home, clock=self.clock, layers=[timed_layer],
                             rule_timeout=args.rule_timeout)
        self.last_review: dict[str, int] = {}
        self.cursor = 0

    def expect(self) -> None:
        """What unchanged worlds owe: exchanges arrive in `slots` waves, one per step."""
        for index in range(self.args.identities):
            exchange_ms = START_MS + (index % self.slots) * self.step_ms
            owed, ceiling = expected_reviews(exchange_ms, self.end_ms, self.config, self.step_ms)
            self.result.expected += owed
            self.result.expected_ceiling += ceiling

    async def arrivals(self, now: int) -> None:
        """The identities whose human exchange arrives at this step."""
        slot = (now - START_MS) // self.step_ms
        if slot >= self.slots:
            return
        batch = [d for i in range(slot, self.args.identities, self.slots)
                 for d in identity_drafts(i, self.args.observations)]
        for at in range(0, len(batch), 4_096):
            await self.engine.append(batch[at:at + 4_096])
        self.result.setup_events += len(batch)

    async def tick(self) -> float:
        """A fresh route-health sample, then one engine tick; its seconds."""
        await self.engine.vitals.record(ROUTE_KEY, {"ok": True, "via": "models"})
        started = time.perf_counter()
        await self.engine.tick()
        return time.perf_counter() - started

    async def settle(self, now: int) -> None:
        """Count the reviews this tick emitted and settle each as a successful review."""
        r = self.result
        settle: list[EventDraft] = []
        for event in await self.engine.events.read(self.cursor, kinds=("effect",)):
            body = event.data.get("effect", {}) if isinstance(event.data, dict) else {}
            if body.get("type") != REVIEW:
                r.other_effects[str(body.get("type"))] += 1
                continue
            r.reviews += 1
            r.reasons[body["reason"]] += 1
            r.carried_skips += int(body.get("quiet_skips", 0))
            ident = body["identity"]
            if ident in self.last_review:
                r.max_gap_ms = max(r.max_gap_ms, now - self.last_review[ident])
            self.last_review[ident] = now
            settle += settle_drafts(event)
        if settle:
            r.review_ticks += 1
            await self.engine.append(settle)
        self.cursor = await self.engine.events.last_seq()

    async def run(self) -> Result:
        r = self.result
        self.expect()
        await self.engine.open()
        side = TimedSideStore(self.engine.side)
        self.quiet.bind(side, self.engine.events)
        try:
            first_seq = self.cursor = await self.engine.events.last_seq()
            started = time.perf_counter()
            while (now := self.clock.now_ms()) <= self.end_ms:
                await self.arrivals(now)
                r.tick.append(await self.tick())
                r.ticks += 1
                await self.settle(now)
                if self.args.progress and r.ticks % self.args.progress == 0:
                    print(f"  .. {(now - START_MS) / 3_600_000:5.2f} h simulated, "
                          f"{r.reviews:,} reviews, {self.rule.skips_counted:,} skips, "
                          f"{time.perf_counter() - started:.0f} s", flush=True)
                self.clock.advance(self.step_ms)
            r.wall_s = time.perf_counter() - started
            await self.quiet.drain()
            r.rule, r.put = list(self.timed.samples), list(side.puts)
            r.rule_cpu = list(self.timed.cpu)
            r.skips = self.rule.skips_counted
            r.deemed = self.quiet.deemed_made
            r.trailing_skips = sum(self.quiet.get(i).skips for i in self.last_review)
            r.kinds = events_by_kind(self.db, first_seq)
            await self.limit()
        finally:
            await self.quiet.drain()
            await self.engine.close()
            await self.reviewer.client.aclose()
        return r

    async def limit(self) -> None:
        """The limit: empty ticks of the same engine, same state, awareness rule switched off."""
        last_seq = await self.engine.events.last_seq()
        self.timed.enabled = False
        for _ in range(self.args.limit_ticks):
            self.clock.advance(self.step_ms)
            self.result.empty_tick.append(await self.tick())
        if await self.engine.events.last_seq() != last_seq:
            extra = events_by_kind(self.db, last_seq)
            raise RuntimeError(f"empty ticks wrote events: {dict(extra)}")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.awareness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--identities", type=int, default=10_000, help="identities (10,000)")
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours (24)")
    parser.add_argument("--step-s", type=float, default=30.0,
                        help="simulated seconds per tick (30, the interval floor)")
    parser.add_argument("--spread-s", type=float, default=300.0,
                        help="human exchanges arrive over this many seconds (300: one quiet hold)")
    parser.add_argument("--observations", type=int, default=3,
                        help="routine observations per identity (3)")
    parser.add_argument("--max-reviews-per-tick", type=int, default=10_000,
                        help="AwarenessConfig.max_reviews_per_tick (10,000: never the bottleneck)")
    parser.add_argument("--quiet-ceiling-s", type=float, default=None,
                        help="AwarenessConfig.quiet_ceiling_s (default: the config's, 3600)")
    parser.add_argument("--rule-timeout", type=float, default=2.0,
                        help="the engine's rule_timeout, also the p99 floor (2 s, the default)")
    parser.add_argument("--limit-ticks", type=int, default=50,
                        help="empty ticks timed after the run, awareness rule off (50)")
    parser.add_argument("--progress", type=int, default=0,
                        help="print progress every N ticks (0: never)")
    parser.add_argument("--tmp", default=None, help="base directory for the home")
    return parser.parse_args(argv)


def make_config(args: argparse.Namespace) -> AwarenessConfig:
    """The default config, but reviews never queue behind the per-tick cap or the budgets:
    this measures the cadence, and budgets would turn checkpoints into skips."""
    overrides: dict[str, Any] = {
        "max_reviews_per_tick": args.max_reviews_per_tick,
        "calls_per_day": 1_000_000_000,
        "calls_per_identity_per_day": 1_000_000,
    }
    if args.quiet_ceiling_s is not None:
        overrides["quiet_ceiling_s"] = args.quiet_ceiling_s
    return msgspec.structs.replace(AwarenessConfig(), **overrides)


async def run(args: argparse.Namespace) -> Report:
    config = make_config(args)
    report = Report(
        f"awareness: {args.identities:,} identities, unchanged worlds, {fmt(args.hours)} "
        f"simulated h in {fmt(args.step_s)} s ticks (ceiling {fmt(config.quiet_ceiling_s)} s, "
        f"hold {fmt(config.quiet_hold_s)} s, interval {fmt(config.healthy_interval_s)} s)")
    with temp_dir(args.tmp) as tmp:
        r = await Simulation(tmp, args, config).run()
    n = args.identities
    hours = args.hours

    calls = Figure("model calls (awareness-review effects)", r.reviews, "calls")
    floor = Figure(f"quiet-ceiling floor ({n:,} first reviews + {r.expected_ceiling:,} "
                   "ceiling checkpoints)", r.expected, "calls")
    report.compare(calls, floor, floor=Floor("floor == 1.00", r.reviews == r.expected))

    gap_s = r.max_gap_ms / 1000
    allowed = config.quiet_ceiling_s + args.step_s
    report.compare(
        Figure("longest gap between two reviews of one identity", gap_s, "s"),
        Figure("quiet_ceiling_s", config.quiet_ceiling_s, "s"),
        floor=Floor(f"floor <= {allowed / config.quiet_ceiling_s:.2f}, i.e. ceiling + one "
                    f"{fmt(args.step_s)} s tick", gap_s <= allowed))

    check_bound = n * hours * 3600 / config.quiet_hold_s
    report.compare(Figure("quiet skips counted (rule.skips_counted)", r.skips, "skips"),
                   Figure("one check per identity per quiet_hold_s", check_bound, "checks"),
                   floor=Floor.ratio_at_most(r.skips / check_bound, 1.0))

    written = sum(r.kinds.values()) - r.setup_events - r.kinds.get("engine-started", 0)
    accounted = r.reviews * len(PER_REVIEW) + r.review_ticks
    report.compare(Figure("events written per simulated hour, inputs aside", written / hours,
                          "events/h"),
                   Figure("events the reviews account for", accounted / hours, "events/h"),
                   floor=Floor("floor == 1.00: quiet skips write nothing",
                               written == accounted))

    rule_ms = [s * 1000 for s in r.rule]
    empty_ms = [s * 1000 for s in r.empty_tick]
    heap_ms = heapq_limit(n) * 1000
    p50, p99 = percentile(rule_ms, 50), percentile(rule_ms, 99)
    report.compare(Figure("awareness rule per tick p50", p50, "ms"),
                   Figure(f"bare heapq push+pop of {n:,} items", heap_ms, "ms"))
    report.compare(Figure("awareness rule per tick p99", p99, "ms"),
                   Figure(f"bare heapq push+pop of {n:,} items", heap_ms, "ms"))
    report.compare(Figure("awareness rule per tick p50", p50, "ms"),
                   Figure("empty tick of the same engine, awareness rule off, p50",
                          median(empty_ms), "ms"))
    report.compare(Figure("awareness rule per tick p99", p99, "ms"),
                   Figure("engine rule_timeout", args.rule_timeout * 1000, "ms"),
                   floor=Floor.ratio_at_most(p99 / (args.rule_timeout * 1000), 1.0))

    report.note(f"reviews by reason: {dict(r.reasons)}; other effects: "
                f"{dict(r.other_effects) or 'none'}")
    report.note(f"quiet skips carried into reviews {r.carried_skips:,} + still held "
                f"{r.trailing_skips:,} = {r.carried_skips + r.trailing_skips:,} "
                f"(counted {r.skips:,}: {r.skips - r.deemed:,} checks made, {r.deemed:,} "
                "deemed made)")
    report.note("events written by kind: " + ", ".join(
        f"{k} {v:,}" for k, v in sorted(r.kinds.items(), key=lambda kv: -kv[1])))
    put_ms = [s * 1000 for s in r.put] or [0.0]
    report.note(f"{r.ticks:,} ticks, {r.review_ticks:,} with reviews; awareness rule max "
                f"{fmt(max(rule_ms))} ms; behind it, the quiet-hold write ({len(r.put):,} side-"
                f"store puts, at most one a tick) p50 {fmt(percentile(put_ms, 50))} / p99 "
                f"{fmt(percentile(put_ms, 99))} ms; "
                f"whole engine.tick() p50 {fmt(percentile(r.tick, 50) * 1000)} / p99 "
                f"{fmt(percentile(r.tick, 99) * 1000)} ms")
    simulated_s = hours * 3600
    report.note(f"wall time {fmt(r.wall_s)} s for {fmt(hours)} simulated h "
                f"({fmt(simulated_s / r.wall_s)}x real time); {fmt(r.reviews / hours)} model "
                f"calls per simulated hour = {fmt(r.reviews / hours / n)} per identity "
                f"(ceiling allows {fmt(3600 / config.quiet_ceiling_s)})")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
