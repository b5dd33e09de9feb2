"""Append throughput through SqliteEventStore beside raw sqlite3 executemany on the same disk.

    python -m bench.append [--events 200000] [--single-events 4000] [--keys 1000]

For 1 and 32 concurrent appender coroutines, each awaiting `store.append([...])` with 100
drafts per call, then with 1 draft per call. Beside 32 single-draft appenders, raw executemany
with 32 rows per commit is context: the most a group commit of them can reach on this disk
(its ratio to one raw writer is the ceiling of the issue's 4x). The limit is plain sqlite3
executemany into a table with the same columns and indexes, synchronous=FULL, WAL, one
thread, with the same number of rows per commit (100, then 1):

- for 1 appender, measured in alternating blocks with the store's calls (`--block`, 10
  commits of 100 rows, 50 of 1), on two files in the same folder, so both meet the disk at the
  same moments (an fsync's cost drifts by several times within a minute on a shared machine);
- for 32 appenders, measured before and after the store's runs (the best of the two).

Floors: 32 appenders x 100 drafts per call >= 0.50 of raw 100 rows per commit; 1 appender x
100 drafts per call >= 0.70 of raw 100 rows per commit, interleaved (issue 27's goal).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import (
    INSERT,
    Figure,
    Floor,
    Report,
    Row,
    event_rows,
    fmt,
    raw_connection,
    raw_insert_rate,
    temp_dir,
    tick_drafts,
)
from pulse_core.store import SqliteEventStore

FLOOR = 0.50  # 32 appenders x 100 drafts/call
LONE_FLOOR = 0.70  # 1 appender x 100 drafts/call, interleaved


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


async def interleaved_rates(tmp: Path, *, per_call: int, events: int, keys: int,
                            synchronous: str, block: int) -> tuple[float, float]:
    """One appender's events/s and raw sqlite3 executemany's rows/s with `per_call` rows per
    commit, in alternating blocks of `block` commits on two files in `tmp`. Returns
    (pulse, raw). Drafts and rows are built before the clock starts."""
    calls = max(1, events // per_call)
    batches = [tick_drafts(c * per_call, per_call, keys) for c in range(calls)]
    rows = event_rows(calls * per_call, keys)
    store = await SqliteEventStore.open(tmp / "events.db", synchronous=synchronous)
    conn = raw_connection(tmp / "raw.db", synchronous)
    pulse_s = raw_s = 0.0
    try:
        for at in range(0, calls, block):
            started = time.perf_counter()
            for call in range(at, min(at + block, calls)):
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(INSERT, rows[call * per_call:(call + 1) * per_call])
                conn.execute("COMMIT")
            raw_done = time.perf_counter()
            for batch in batches[at:at + block]:
                await store.append(batch)
            pulse_s += time.perf_counter() - raw_done
            raw_s += raw_done - started
        stored = await store.last_seq()
    finally:
        conn.close()
        await store.close()
    if stored != calls * per_call:
        raise RuntimeError(f"stored {stored} events, expected {calls * per_call}")
    return stored / pulse_s, len(rows) / raw_s


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
    parser.add_argument("--block", type=int, default=None,
                        help="commits per alternating block for 1 appender (default 10 with "
                             "100 drafts/call, 50 with 1)")
    parser.add_argument("--synchronous", default="FULL", help="store and raw setting (FULL)")
    parser.add_argument("--tmp", default=None, help="base directory for the databases")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> Report:
    report = Report(f"append: SqliteEventStore vs raw sqlite3 (synchronous={args.synchronous}, "
                    f"WAL, {args.keys} interleaved keys)")
    judged = max(args.appenders)
    for per_call, events in ((args.batch, args.events), (1, args.single_events)):
        rows = event_rows(events, args.keys)
        block = args.block or (10 if per_call > 1 else 50)
        rows_text = f"{per_call} row{'s' * (per_call > 1)}/commit"
        drafts_text = f"{per_call} draft{'s' * (per_call > 1)}/call"

        def raw_rate(per_call: int = per_call, rows: list[Row] = rows) -> float:
            with temp_dir(args.tmp) as tmp:
                return raw_insert_rate(tmp / "raw.db", rows, per_call, args.synchronous)

        # Beside many appenders the limit is the best the machine did: measured before and
        # after their runs. A lone appender takes turns with raw, block by block.
        raws = [raw_rate()] if any(a > 1 for a in args.appenders) else []
        for appenders in args.appenders:
            with temp_dir(args.tmp) as tmp:
                if appenders == 1:
                    rate, raw = await interleaved_rates(
                        tmp, per_call=per_call, events=events, keys=args.keys,
                        synchronous=args.synchronous, block=block)
                    lone = Floor.ratio_at_least(rate / raw, LONE_FLOOR) \
                        if per_call == args.batch else None
                    report.compare(Figure(f"append 1 appender x {drafts_text}", rate, "ev/s"),
                                   Figure(f"raw sqlite3 executemany {rows_text}, interleaved",
                                          raw, "rows/s"), floor=lone)
                    continue
                rate = await store_rate(
                    tmp / "events.db", appenders=appenders, per_call=per_call, events=events,
                    keys=args.keys, synchronous=args.synchronous)
            if len(raws) == 1:
                raws.append(raw_rate())
            floor = None
            if appenders == judged and per_call == args.batch:
                floor = Floor.ratio_at_least(rate / max(raws), FLOOR)
            report.compare(Figure(f"append {appenders} appenders x {drafts_text}", rate,
                                  "ev/s"),
                           Figure(f"raw sqlite3 executemany {rows_text}", max(raws), "rows/s"),
                           floor=floor)
            if per_call == 1:
                # The most any group commit of these appenders can do: every commit holding
                # one row per appender, with nothing of pulse around it.
                ceiling = raw_rate(appenders)
                report.compare(Figure(f"raw sqlite3 executemany {appenders} rows/commit "
                                      "(the ceiling of a group commit of them)", ceiling,
                                      "rows/s"),
                               Figure(f"raw sqlite3 executemany {rows_text}", max(raws),
                                      "rows/s"), floor=None)
        if raws:
            report.note(f"raw {per_call}/commit before and after the runs of many appenders: "
                        + " and ".join(f"{fmt(r)} rows/s" for r in raws)
                        + "; the best is their limit")
    report.note(f"1 appender: pulse and raw in alternating blocks of commits (--block); floors "
                f"judged on 1 appender x {args.batch} drafts/call (>= {LONE_FLOOR:.2f}) and "
                f"{judged} appenders x {args.batch} drafts/call (>= {FLOOR:.2f}); the single-"
                "draft lines are context (bench.append_latency judges those)")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
