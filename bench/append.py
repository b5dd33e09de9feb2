"""Append throughput through SqliteEventStore beside raw sqlite3 executemany on the same disk.

    python -m bench.append [--events 200000] [--single-events 4000] [--keys 1000]

For 1 and 32 concurrent appender coroutines, each awaiting `store.append([...])` with 100
drafts per call, then with 1 draft per call. The limit is plain sqlite3 executemany into a
table with the same columns and indexes, synchronous=FULL, WAL, one thread, with the same
number of rows per commit (100, then 1), measured before and after the store's runs (the best
of the two is the limit). Floor (judged on 32 appenders x 100 drafts per call
against 100 rows per commit): >= 0.50 of raw.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import (
    Figure,
    Floor,
    Report,
    Row,
    event_rows,
    fmt,
    raw_insert_rate,
    temp_dir,
    tick_drafts,
)
from pulse_core.store import SqliteEventStore

FLOOR = 0.50


async def store_rate(path: Path, *, appenders: int, per_call: int, events: int, keys: int,
                     synchronous: str = "FULL") -> float:
    """Events/s of `appenders` coroutines appending `per_call` drafts per call, `events` in all.

    Drafts are built before the clock starts, as for the raw limit; checking, encoding and
    the group commit are all inside the measurement.
    """
    calls = max(1, events // per_call)
    batches = [tick_drafts(c * per_call, per_call, keys) for c in range(calls)]
    store = await SqliteEventStore.open(path, synchronous=synchronous)
    try:
        async def appender(index: int) -> None:
            for batch in batches[index::appenders]:
                await store.append(batch)

        started = time.perf_counter()
        await asyncio.gather(*(appender(i) for i in range(appenders)))
        elapsed = time.perf_counter() - started
        stored = await store.last_seq()
    finally:
        await store.close()
    if stored != calls * per_call:
        raise RuntimeError(f"stored {stored} events, expected {calls * per_call}")
    return stored / elapsed


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.append", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000,
                        help="events per run with 100-draft calls (default 200,000)")
    parser.add_argument("--single-events", type=int, default=4_000,
                        help="events per run with 1-draft calls (default 4,000; fsync-bound)")
    parser.add_argument("--batch", type=int, default=100, help="drafts per call (default 100)")
    parser.add_argument("--keys", type=int, default=1_000, help="distinct interleaved keys")
    parser.add_argument("--appenders", type=int, nargs="+", default=[1, 32],
                        help="appender counts to run (default 1 32; the floor is judged at 32)")
    parser.add_argument("--synchronous", default="FULL", help="store and raw setting (FULL)")
    parser.add_argument("--tmp", default=None, help="base directory for the databases")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> Report:
    report = Report(f"append: SqliteEventStore vs raw sqlite3 (synchronous={args.synchronous}, "
                    f"WAL, {args.keys} interleaved keys)")
    judged = max(args.appenders)
    for per_call, events in ((args.batch, args.events), (1, args.single_events)):
        rows = event_rows(events, args.keys)

        def raw_rate(per_call: int = per_call, rows: list[Row] = rows) -> float:
            with temp_dir(args.tmp) as tmp:
                return raw_insert_rate(tmp / "raw.db", rows, per_call, args.synchronous)

        # The limit is the best the machine did: measured before and after the store's runs.
        raws = [raw_rate()]
        figures: list[tuple[int, float]] = []
        for appenders in args.appenders:
            with temp_dir(args.tmp) as tmp:
                figures.append((appenders, await store_rate(
                    tmp / "events.db", appenders=appenders, per_call=per_call, events=events,
                    keys=args.keys, synchronous=args.synchronous)))
        raws.append(raw_rate())
        raw = max(raws)
        limit = Figure(f"raw sqlite3 executemany {per_call} row{'s' * (per_call > 1)}/commit",
                       raw, "rows/s")
        for appenders, rate in figures:
            figure = Figure(f"append {appenders} appender{'s' * (appenders > 1)} x "
                            f"{per_call} draft{'s' * (per_call > 1)}/call", rate, "ev/s")
            floor = None
            if appenders == judged and per_call == args.batch:
                floor = Floor.ratio_at_least(rate / raw, FLOOR)
            report.compare(figure, limit, floor=floor)
        report.note(f"raw {per_call}/commit before and after the store runs: "
                    + " and ".join(f"{fmt(r)} rows/s" for r in raws) + "; the best is the limit")
    report.note(f"floor judged on {judged} appenders x {args.batch} drafts/call vs raw "
                f"{args.batch} rows/commit; other lines are reported for context")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
