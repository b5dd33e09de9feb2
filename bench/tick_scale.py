"""One tick's cost with a small and a large history: a tick must read only what is new.

    python -m bench.tick_scale [--small 1000] [--large 1000000] [--ticks 50] [--mix plain]

For each size: build the history through SqliteEventStore.append (4096-draft calls), open an
Engine with one trivial rule (the first open folds the whole log and checkpoints it), run one
tick and `--warmup` warm-up ticks, then time `--ticks` ticks with `--new-events` new events
appended before each.
Reports the median tick at both sizes and their ratio (floor: large <= 2x small), the first
open's one-time fold beside a raw full-table scan, a reopen from checkpoints, and the limit for
a tick: raw sqlite3 `SELECT ... WHERE seq > ?` of the same few new rows.

`--mix plain` is `tick` events on 1000 keys (no projection reads them); `--mix tasks` puts a
whole task lifecycle and an effect lifecycle in every 20 events, so the built-in projections
fold real work, and makes each tick's new events include one `task-created`.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import (
    COLUMNS,
    Figure,
    Floor,
    Report,
    fmt,
    median,
    raw_select_after,
    temp_dir,
    tick_drafts,
    tick_payload,
)
from pulse_core import Decision, Engine, EventDraft, Inner, Snapshot
from pulse_core.store import SqliteEventStore

FLOOR_RATIO = 2.0
BUILD_CALL = 4_096
BUILD_APPENDERS = 4


async def passthrough(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    """The trivial rule: hand the tick to the rest of the chain."""
    return await inner(prev, curr)


def _task_block(block: int) -> list[EventDraft]:
    """20 events: a task created -> closed, an effect -> acked, and 12 ticks."""
    task = f"task-{block:08d}"
    effect = f"bench-effect-{block:08d}"
    drafts = [
        EventDraft("task-created", task, {"title": f"task {block}", "project": f"p{block % 7}",
                                          "prompt": "", "priority": block % 3}),
        EventDraft("task-assigned", task, {"agent": f"agent-{block % 5}"}),
        EventDraft("task-executing", task),
        EventDraft("task-acked", task, {"result": {"ok": True}}),
        EventDraft("task-closed", task),
        EventDraft("effect", effect, {"effect": {"type": "bench-noop"}, "dedup": effect},
                   origin="engine:tick"),
        EventDraft("effect-executing", effect, {"attempt": 1, "lease_until": 0, "owner": "bench"},
                   origin="executor:bench"),
        EventDraft("effect-acked", effect, {"attempt": 1, "result": None, "duration_ms": 1},
                   origin="executor:bench"),
    ]
    drafts += tick_drafts(block * 12, 12, 1000)
    return drafts


def history(start: int, count: int, mix: str) -> list[EventDraft]:
    """Drafts number start..start+count of the history (blocks of 20 for the tasks mix)."""
    if mix == "plain":
        return tick_drafts(start, count, 1000)
    drafts: list[EventDraft] = []
    block = start // 20
    while len(drafts) < count:
        drafts += _task_block(block)
        block += 1
    return drafts[:count]


def new_events(tick: int, count: int, mix: str) -> list[EventDraft]:
    """What arrives between two ticks: `count` ticks, one of them a new task in the tasks mix."""
    drafts = [EventDraft("tick", f"live-{i % 10}", tick_payload(i), origin="engine")
              for i in range(tick * count, (tick + 1) * count)]
    if mix == "tasks":
        drafts[0] = EventDraft("task-created", f"live-task-{tick:06d}",
                               {"title": "live", "project": "live", "prompt": "", "priority": 1})
    return drafts


async def build(path: Path, events: int, mix: str) -> float:
    """Append `events` drafts in 4096-draft calls from a few appenders; returns seconds."""
    store = await SqliteEventStore.open(path, synchronous="FULL")
    calls = [(at, min(BUILD_CALL, events - at)) for at in range(0, events, BUILD_CALL)]
    started = time.perf_counter()
    try:
        async def appender(index: int) -> None:
            for at, count in calls[index::BUILD_APPENDERS]:
                await store.append(history(at, count, mix))

        await asyncio.gather(*(appender(i) for i in range(BUILD_APPENDERS)))
        elapsed = time.perf_counter() - started
    finally:
        await store.close()
    return elapsed


def raw_scan(path: Path) -> float:
    """Seconds to read every row with plain sqlite3: the floor under a first open's fold."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        started = time.perf_counter()
        for _ in conn.execute(f"SELECT {COLUMNS} FROM events WHERE seq > 0 ORDER BY seq"):
            pass
        return time.perf_counter() - started
    finally:
        conn.close()


class SizeResult:
    """What one history size measured."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.build_s = 0.0
        self.first_open_s = 0.0
        self.reopen_s = 0.0
        self.scan_s = 0.0
        self.ticks: list[float] = []
        self.select: list[float] = []
        self.select_rows = 0

    @property
    def tick_ms(self) -> float:
        return median(self.ticks) * 1000

    @property
    def select_ms(self) -> float:
        return median(self.select) * 1000


async def measure(home: Path, size: int, args: argparse.Namespace) -> SizeResult:
    result = SizeResult(size)
    result.build_s = await build(home / "events.db", size, args.mix)
    result.scan_s = raw_scan(home / "events.db")
    engine = Engine(home, rules=[passthrough])
    started = time.perf_counter()
    await engine.open()
    result.first_open_s = time.perf_counter() - started
    try:
        await engine.tick()
        for n in range(args.warmup):
            await engine.append(new_events(n, args.new_events, args.mix))
            await engine.tick()
        for n in range(args.warmup, args.warmup + args.ticks):
            await engine.append(new_events(n, args.new_events, args.mix))
            started = time.perf_counter()
            await engine.tick()
            result.ticks.append(time.perf_counter() - started)
        last = await engine.events.last_seq()
        result.select, result.select_rows = raw_select_after(
            home / "events.db", last - args.new_events, args.ticks)
    finally:
        await engine.close()
    reopened = Engine(home, rules=[passthrough])
    started = time.perf_counter()
    await reopened.open()
    result.reopen_s = time.perf_counter() - started
    await reopened.close()
    return result


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.tick_scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=1_000, help="small history (1,000)")
    parser.add_argument("--large", type=int, default=1_000_000,
                        help="large history (1,000,000; 100,000 for a quick run)")
    parser.add_argument("--ticks", type=int, default=50, help="timed ticks per size (50)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed ticks (with new events) before the timed ones (5)")
    parser.add_argument("--new-events", type=int, default=5, help="events before each tick (5)")
    parser.add_argument("--mix", choices=("plain", "tasks"), default="plain",
                        help="history content (default plain)")
    parser.add_argument("--tmp", default=None, help="base directory for the homes")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> Report:
    report = Report(f"tick_scale: one tick with {args.small:,} vs {args.large:,} events of "
                    f"history ({args.mix} mix, {args.new_events} new events per tick, median of "
                    f"{args.ticks})")
    results: dict[int, SizeResult] = {}
    for size in (args.small, args.large):
        with temp_dir(args.tmp) as tmp:
            results[size] = await measure(tmp, size, args)
    small, large = results[args.small], results[args.large]

    def tick(r: SizeResult) -> Figure:
        return Figure(f"tick at {r.size:,} events", r.tick_ms, "ms")

    ratio = large.tick_ms / small.tick_ms
    report.compare(tick(large), tick(small), floor=Floor.ratio_at_most(ratio, FLOOR_RATIO))
    for r in (small, large):
        report.compare(tick(r), Figure(
            f"raw sqlite3 SELECT WHERE seq > ? ({r.select_rows} new rows)", r.select_ms, "ms"))
    for r in (small, large):
        report.compare(Figure(f"first open at {r.size:,} events (folds whole log)",
                              r.first_open_s * 1000, "ms"),
                       Figure("raw sqlite3 full scan", r.scan_s * 1000, "ms"))
        report.compare(Figure(f"reopen at {r.size:,} events (from checkpoints)",
                              r.reopen_s * 1000, "ms"),
                       Figure("raw sqlite3 full scan", r.scan_s * 1000, "ms"))
    for r in (small, large):
        spread = sorted(r.ticks)
        report.note(f"{r.size:,} events: history built in {fmt(r.build_s)} s "
                    f"({fmt(r.size / r.build_s)} ev/s through store.append, 4096-draft calls); "
                    f"tick min {fmt(spread[0] * 1000)} / p90 "
                    f"{fmt(spread[int(len(spread) * 0.9) - 1] * 1000)} / max "
                    f"{fmt(spread[-1] * 1000)} ms")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
