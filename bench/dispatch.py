"""Dispatch latency: effect committed -> executor entered, in one process.

    python -m bench.dispatch [--effects 10000]

An ExecutorLoop runs as `asyncio.create_task(loop.run())`; effects are appended one at a time
with `store.append([effect_draft(effect, origin="engine:tick")])`. t0 is taken when append
returns; the executor records `time.perf_counter()` on entry. The next effect is appended once
the previous one is acked, so each sample is one effect's latency, not a queue's.

Limit: a bare asyncio.Event wake-up (set in one task, measured in the waiting task). Between
commit and entry the loop must also make its claim durable (`effect-executing`, one commit with
synchronous=FULL), so a raw sqlite3 single-row FULL commit is printed too, for context.
Floor: p99 < 10 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    Figure,
    Floor,
    Ping,
    Report,
    asyncio_wake_latencies,
    percentile,
    raw_commit_latencies,
    temp_dir,
)
from pulse_core._effects import ExecutionContext, Executor, effect_draft
from pulse_core._executor_loop import ExecutorLoop
from pulse_core.store import SqliteEventStore

FLOOR_P99_MS = 10.0


class EntryRecorder(Executor):
    """Records perf_counter() the moment `execute` is entered, then returns at once."""

    handles = (Ping,)

    def __init__(self) -> None:
        self.entered: dict[int, float] = {}
        self.signal = asyncio.Event()

    async def execute(self, effect: Any, ctx: ExecutionContext) -> Any:
        now = time.perf_counter()
        self.entered[effect.n] = now
        self.signal.set()
        return None


async def dispatch_latencies(path: Path, count: int, synchronous: str = "FULL") -> list[float]:
    """Seconds from append returning to executor entry, for `count` effects one after another."""
    store = await SqliteEventStore.open(path, synchronous=synchronous)
    recorder = EntryRecorder()
    loop = ExecutorLoop(store, [recorder])
    runner = asyncio.create_task(loop.run())
    committed = store.subscribe()
    latencies: list[float] = []
    try:
        for n in range(count):
            recorder.signal.clear()
            result = await store.append([effect_draft(Ping(n=n), origin="engine:tick")])
            t0 = time.perf_counter()
            while n not in recorder.entered:
                await asyncio.wait_for(recorder.signal.wait(), 10)
                recorder.signal.clear()
            latencies.append(recorder.entered[n] - t0)
            # Wait for the ack (effect, effect-executing, effect-acked) before the next one.
            acked = result.last_seq + 2
            while True:
                committed.clear()
                if await store.last_seq() >= acked:
                    break
                await asyncio.wait_for(committed.wait(), 10)
    finally:
        store.unsubscribe(committed)
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await store.close()
    return latencies


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.dispatch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--effects", type=int, default=10_000, help="effects (default 10,000)")
    parser.add_argument("--synchronous", default="FULL", help="events.db setting (FULL)")
    parser.add_argument("--tmp", default=None, help="base directory for the database")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> Report:
    report = Report(f"dispatch: effect committed -> executor entered, {args.effects:,} effects "
                    f"(synchronous={args.synchronous})")
    with temp_dir(args.tmp) as tmp:
        dispatch = await dispatch_latencies(tmp / "events.db", args.effects, args.synchronous)
    wake = await asyncio_wake_latencies(args.effects)
    with temp_dir(args.tmp) as tmp:
        commits = raw_commit_latencies(tmp / "raw.db", min(args.effects, 2_000),
                                       args.synchronous)
    for p in (50, 99):
        figure = Figure(f"dispatch p{p}", percentile(dispatch, p) * 1000, "ms")
        limit = Figure(f"bare asyncio.Event wake-up p{p}", percentile(wake, p) * 1000, "ms")
        floor = Floor.below(figure, FLOOR_P99_MS, "p99") if p == 99 else None
        report.compare(figure, limit, floor=floor)
    for p in (50, 99):
        figure = Figure(f"dispatch p{p}", percentile(dispatch, p) * 1000, "ms")
        limit = Figure(f"raw sqlite3 1-row {args.synchronous} commit p{p}",
                       percentile(commits, p) * 1000, "ms")
        report.compare(figure, limit)
    report.note(f"dispatch max {max(dispatch) * 1000:.2f} ms; each dispatch includes one "
                "durable claim commit (effect-executing), hence the commit line")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
