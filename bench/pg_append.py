"""Append throughput on PostgreSQL: EventStore beside raw batched INSERTs with the same driver.

    python -m bench.pg_append [--events 96000] [--processes 4] [--producers 32] [--batch 100]

32 producers spread over 4 processes (8 coroutines each). Through pulse, each producer awaits
`store.append([...])` with 100 drafts per call on its process's EventStore (one per
process: its group commit, the writer lock shared by all, seqs in commit order). The limit
is the same producers, each on its own psycopg connection, inserting the same rows into a
table with the same columns and indexes with `executemany`, 100 rows per transaction, seq
from an identity column: no ordering, no versions, no idempotency. The server is started
here (tests/servers.py) with fsync on, unless `--url` names one. Floor: >= 0.50 of raw.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import Sequence

from bench.common import (
    RAW_INSERT,
    RAW_TABLE,
    Figure,
    Floor,
    Report,
    fmt,
    postgres_database,
    python_module,
    tick_drafts,
)
from pulse_core._events import encode_data, uuid7

FLOOR = 0.50


# -- one child process ----------------------------------------------------------------------


async def child_store(args: argparse.Namespace) -> float:
    """This process's producers appending through one EventStore; when they started."""
    from pulse_core.store import open_event_store

    producers, batch = args.producers, args.batch
    batches = [tick_drafts(args.offset + c * batch, batch, args.keys)
               for c in range(producers * args.calls)]
    store = await open_event_store(args.url)
    try:
        await store.last_seq()  # connected before the clock starts
        ready_and_wait()
        started = time.time()

        async def producer(index: int) -> None:
            for drafts in batches[index::producers]:
                await store.append(drafts)

        await asyncio.gather(*(producer(i) for i in range(producers)))
        return started
    finally:
        await store.close()


async def child_raw(args: argparse.Namespace) -> float:
    """This process's producers inserting raw rows, a connection each; when they started."""
    import psycopg

    from pulse_core.store import PostgresURL, parse_store_url

    producers, batch, keys, offset = args.producers, args.batch, args.keys, args.offset
    parsed = parse_store_url(args.url)
    assert isinstance(parsed, PostgresURL)
    now = time.time_ns() // 1_000_000
    rows = [[(uuid7(), "tick", f"subject-{i % keys:05d}", 1, now, "engine", None, uuid7(),
              None, encode_data({"n": i, "load": 0.42, "note": "bench"}), None)
             for i in range(offset + c * batch, offset + (c + 1) * batch)]
            for c in range(producers * args.calls)]
    conns = [await psycopg.AsyncConnection.connect(parsed.dsn, autocommit=True)
             for _ in range(producers)]
    try:
        ready_and_wait()
        started = time.time()

        async def producer(index: int) -> None:
            conn = conns[index]
            for chunk in rows[index::producers]:
                async with conn.transaction(), conn.cursor() as cur:
                    await cur.executemany(RAW_INSERT, chunk)

        await asyncio.gather(*(producer(i) for i in range(producers)))
        return started
    finally:
        for conn in conns:
            await conn.close()


def ready_and_wait() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def child(args: argparse.Namespace) -> int:
    run = child_store if args.child == "store" else child_raw
    started = asyncio.run(run(args))
    print(f"done {started} {time.time()}", flush=True)
    return 0


# -- the parent ---------------------------------------------------------------------------


def measure(kind: str, url: str, args: argparse.Namespace) -> float:
    """Events/s of `kind` (store or raw) over all child processes, from the common start to
    the last one done."""
    per_process = args.producers // args.processes
    calls = max(1, args.events // (args.producers * args.batch))
    children = [subprocess.Popen(
        python_module("bench.pg_append", "--child", kind, "--url", url, "--producers",
                      str(per_process), "--calls", str(calls), "--batch", str(args.batch),
                      "--keys", str(args.keys), "--offset", str(p * per_process * calls *
                                                                  args.batch)),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for p in range(args.processes)]
    for proc in children:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in children:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    spans = []
    for proc in children:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{kind} child failed ({proc.returncode})")
        _, started, ended = out.split()
        spans.append((float(started), float(ended)))
    total: int = args.processes * per_process * calls * args.batch
    return total / (max(e for _, e in spans) - min(s for s, _ in spans))


def run(args: argparse.Namespace, url: str, admin: str) -> Report:
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(RAW_TABLE)
    report = Report(f"append on PostgreSQL: {args.producers} producers over {args.processes} "
                    f"processes, {args.batch} drafts per call, fsync "
                    f"{'as the server has it' if args.url else 'on'}")
    raws = [measure("raw", url, args)]
    store = measure("store", url, args)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(RAW_TABLE)
    raws.append(measure("raw", url, args))
    raw = max(raws)
    figure = Figure(f"EventStore.append {args.producers} producers x {args.batch} drafts/call",
                    store, "ev/s")
    limit = Figure(f"raw psycopg executemany {args.batch} rows/transaction", raw, "rows/s")
    report.compare(figure, limit, floor=Floor.ratio_at_least(store / raw, FLOOR))
    report.note("raw before and after the store run: "
                + " and ".join(f"{fmt(r)} rows/s" for r in raws) + "; the best is the limit")
    return report


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_append", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=96_000, help="events per run")
    parser.add_argument("--processes", type=int, default=4, help="processes (default 4)")
    parser.add_argument("--producers", type=int, default=32, help="producers in all (32)")
    parser.add_argument("--batch", type=int, default=100, help="drafts per call (100)")
    parser.add_argument("--keys", type=int, default=1_000, help="distinct interleaved keys")
    parser.add_argument("--url", default=None, help="an empty database (default: start one)")
    parser.add_argument("--child", choices=("store", "raw"), help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        return child(args)
    if args.url:
        from pulse_core.store import PostgresURL, parse_store_url

        parsed = parse_store_url(args.url)
        assert isinstance(parsed, PostgresURL)
        return run(args, args.url, parsed.dsn).exit_code()
    with postgres_database() as url:
        return run(args, url, url).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
