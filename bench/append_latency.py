"""Single-draft append latency through SqliteEventStore beside raw sqlite3 single-row commits.

    python -m bench.append_latency [--appends 2000] [--keys 1000]

One coroutine awaits `store.append([draft])` once per draft, one call at a time (latency, not
throughput): `--appends` calls over `--keys` interleaved keys, synchronous=FULL, WAL. Beside it,
in the same run, on the same disk, with the same number of commits:

- raw sqlite3: one row per transaction (BEGIN IMMEDIATE, INSERT, COMMIT) into a table with the
  same columns and indexes, on the same thread, in blocks (`--block`, 50) alternating with
  pulse's, so both meet the disk at the same moments; its rows/s is the limit;
- the same raw commits with each COMMIT handed to a bare thread that the caller waits for
  (in the same alternating blocks): the shape that keeps a stalled disk off the loop, with
  nothing of pulse's around it, so its ratio to raw is the ceiling of any commit made off the
  loop's thread on this machine, and pulse's ratio to it what the store costs beyond that;
- the `eventsourcing` library's SQLite aggregate recorder, when the package is installed:
  `insert_events([stored_event])` once per event, a file database, WAL, synchronous=FULL, its
  own table (skipped, with a line saying so, when it is not installed).

Prints p50 and p99 latency in µs and appends/s for each, and the ratios pulse/raw and
eventsourcing/raw. Floor (judged on pulse appends/s against raw 1-row commits/s): >= 0.80.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import sqlite3
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    INSERT,
    Figure,
    Floor,
    Report,
    event_rows,
    percentile,
    raw_connection,
    temp_dir,
    tick_drafts,
    tick_payload,
)
from pulse_core._events import encode_data
from pulse_core.store import SqliteEventStore

FLOOR = 0.80
SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class Run:
    """One contender's per-append latencies (seconds) and its appends/s over the whole loop."""

    def __init__(self, latencies: list[float], rate: float) -> None:
        self.latencies = latencies
        self.rate = rate

    def p(self, q: float) -> float:
        """The q-th percentile latency in µs."""
        return percentile(self.latencies, q) * 1e6


class CommitThread:
    """A bare thread that runs one raw COMMIT at a time for a caller that waits for it
    blocked: the store's shape for a lone append (the transaction written on the loop's
    thread, its COMMIT in the writer thread, so that a disk which stops answering never
    holds the loop) with nothing of the store's around it. Its rate beside raw's is the most
    any commit made off the caller's thread can reach on this machine: the two wake-ups it
    adds (the thread's, then the caller's) are not the store's to save."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[sqlite3.Connection, threading.Lock] | None] = (
            queue.SimpleQueue())
        self._thread = threading.Thread(target=self._run, name="bench-commit", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            conn, done = job
            conn.execute("COMMIT")
            done.release()

    def commit(self, conn: sqlite3.Connection) -> None:
        """COMMIT `conn`'s transaction in the thread; return when it has."""
        done = threading.Lock()
        done.acquire()
        self._jobs.put((conn, done))
        done.acquire()

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join()


async def interleaved(tmp: Path, *, appends: int, keys: int, synchronous: str,
                      block: int) -> tuple[Run, Run, Run]:
    """pulse's `store.append([draft])`, raw sqlite3 single-row commits, and the same raw
    commits with their COMMIT in a thread (`CommitThread`), in alternating blocks of `block`,
    `appends` of each, on three files in the same folder: all meet the same disk at the same
    moments (an fsync's cost drifts by several times within a minute on a shared machine).
    Returns (pulse, raw, raw with the COMMIT in a thread).

    Drafts and rows are built before the clock starts; checking, encoding, versioning and
    the commit are inside each pulse sample.
    """
    drafts = tick_drafts(0, appends, keys)
    rows = event_rows(appends, keys)
    store = await SqliteEventStore.open(tmp / "events.db", synchronous=synchronous)
    conn = raw_connection(tmp / "raw.db", synchronous)
    handed = raw_connection(tmp / "raw-thread.db", synchronous, any_thread=True)
    committer = CommitThread()
    pulse: list[float] = []
    raw: list[float] = []
    raw_thread: list[float] = []
    try:
        for at in range(0, appends, block):
            for row in rows[at:at + block]:
                t0 = time.perf_counter()
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(INSERT, row)
                conn.execute("COMMIT")
                raw.append(time.perf_counter() - t0)
            for row in rows[at:at + block]:
                t0 = time.perf_counter()
                handed.execute("BEGIN IMMEDIATE")
                handed.execute(INSERT, row)
                committer.commit(handed)
                raw_thread.append(time.perf_counter() - t0)
            for draft in drafts[at:at + block]:
                t0 = time.perf_counter()
                await store.append([draft])
                pulse.append(time.perf_counter() - t0)
        stored = await store.last_seq()
    finally:
        committer.stop()
        conn.close()
        handed.close()
        await store.close()
    if stored != appends:
        raise RuntimeError(f"stored {stored} events, expected {appends}")
    return (Run(pulse, appends / sum(pulse)), Run(raw, appends / sum(raw)),
            Run(raw_thread, appends / sum(raw_thread)))


def eventsourcing_run(path: Path, *, appends: int, keys: int,
                      synchronous: str) -> tuple[Run, str] | None:
    """`appends` calls of eventsourcing's `SQLiteAggregateRecorder.insert_events([one])`, or
    None when the package is not installed. Also returns how its connections were set up.

    The recorder is synchronous (no asyncio layer): it is called directly, one call at a time.
    The stored events mirror the drafts: `keys` interleaved originators, per-originator
    versions, topic `tick`, the same JSON payload as state.
    """
    try:
        from eventsourcing.persistence import StoredEvent
        from eventsourcing.sqlite import SQLiteAggregateRecorder, SQLiteDatastore
    except ImportError:
        return None
    datastore = SQLiteDatastore(str(path))
    # Its pool opens each connection with journal_mode=WAL and leaves synchronous at SQLite's
    # default (no option for it): set it on every connection the pool makes.
    create = datastore.pool._create_connection

    def create_with_synchronous(*args: Any, **kwargs: Any) -> Any:
        conn = create(*args, **kwargs)
        conn._sqlite_conn.execute(f"PRAGMA synchronous={synchronous}")
        return conn

    datastore.pool._create_connection = create_with_synchronous  # type: ignore[method-assign]
    recorder = SQLiteAggregateRecorder(datastore, events_table_name="stored_events")
    recorder.create_table()
    with datastore.get_connection(commit=False) as conn:
        mode = conn._sqlite_conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = conn._sqlite_conn.execute("PRAGMA synchronous").fetchone()[0]
    setup = (f"eventsourcing {_version('eventsourcing')}: SQLiteDatastore on a file, "
             f"journal_mode={mode}, synchronous={SYNCHRONOUS.get(sync, sync)}, its own table "
             "(originator_id, originator_version, topic, state; one WITHOUT ROWID primary key)")
    originators = [uuid.uuid4() for _ in range(keys)]
    events = [StoredEvent(originator_id=originators[i % keys], originator_version=i // keys + 1,
                          topic="tick", state=encode_data(tick_payload(i)))
              for i in range(appends)]
    latencies: list[float] = []
    try:
        started = time.perf_counter()
        for event in events:
            t0 = time.perf_counter()
            recorder.insert_events([event])
            latencies.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - started
        stored = sum(len(recorder.select_events(o)) for o in originators)
    finally:
        datastore.close()
    if stored != appends:
        raise RuntimeError(f"eventsourcing stored {stored} events, expected {appends}")
    return Run(latencies, appends / elapsed), setup


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.append_latency", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--appends", type=int, default=2_000,
                        help="single-draft appends per contender (default 2,000; fsync-bound)")
    parser.add_argument("--keys", type=int, default=1_000, help="distinct interleaved keys")
    parser.add_argument("--block", type=int, default=50,
                        help="pulse appends and raw commits per alternating block (default 50)")
    parser.add_argument("--synchronous", default="FULL", help="setting for all three (FULL)")
    parser.add_argument("--tmp", default=None, help="base directory for the databases")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> Report:
    report = Report(f"append latency: one draft per call, one call at a time, {args.appends:,} "
                    f"appends (synchronous={args.synchronous}, WAL, {args.keys} interleaved "
                    "keys)")
    with temp_dir(args.tmp) as tmp:
        pulse, raw, raw_thread = await interleaved(
            tmp, appends=args.appends, keys=args.keys, synchronous=args.synchronous,
            block=args.block)
    with temp_dir(args.tmp) as tmp:
        es = eventsourcing_run(tmp / "es.db", appends=args.appends, keys=args.keys,
                               synchronous=args.synchronous)

    contenders = [("pulse append", pulse)]
    if es is not None:
        contenders.append(("eventsourcing insert_events", es[0]))
    for name, measured in contenders:
        for q in (50, 99):
            report.compare(Figure(f"{name} p{q}", measured.p(q), "µs"),
                           Figure(f"raw sqlite3 1-row commit p{q}", raw.p(q), "µs"))
        floor = Floor.ratio_at_least(measured.rate / raw.rate, FLOOR) \
            if measured is pulse else None
        report.compare(Figure(f"{name} 1 draft/call", measured.rate, "appends/s"),
                       Figure("raw sqlite3 1-row commits", raw.rate, "rows/s"),
                       floor=floor)
    ceiling = Figure("raw sqlite3 1-row commits, COMMIT in a thread", raw_thread.rate,
                     "rows/s")
    report.compare(ceiling, Figure("raw sqlite3 1-row commits", raw.rate, "rows/s"))
    report.compare(Figure("pulse append 1 draft/call", pulse.rate, "appends/s"), ceiling)
    if es is None:
        report.note("eventsourcing is not installed: its comparison is skipped "
                    "(pip install eventsourcing to include it)")
    else:
        report.note(es[1] + "; called directly (it has no asyncio layer)")
    report.note("COMMIT in a thread: the raw commits again, each COMMIT handed to a bare "
                "thread the caller waits for blocked (the shape that keeps a stalled disk off "
                "the loop, nothing of pulse's around it): its ratio to raw is the most any "
                "commit off the loop's thread reaches here; pulse's ratio to it, what the "
                "store costs beyond that shape")
    report.note(f"pulse and the two raw ran in alternating blocks of {args.block}; "
                "eventsourcing ran "
                "after them, beside the same raw figure (not interleaved: read its ratio "
                "loosely)")
    report.note("latency lines: ratio = latency / raw latency (lower is better); appends/s "
                f"lines: ratio = rate / raw rate; floor judged on pulse appends/s, "
                f">= {FLOOR:.2f} of raw")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
