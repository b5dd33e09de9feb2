"""Appends on PostgreSQL at low concurrency: EventStore beside one raw INSERT per commit.

    python -m bench.pg_single [--appends 1000] [--url postgresql://...]

Three measures, each beside its limit taken in the same run on the same server with the
driver the recorder uses (psycopg 3, async, autocommit, statements prepared), into a table
with the log's columns and indexes, seq from an identity column (no ordering, versions or
idempotency):

- one writer, 1 event per append, awaited one after the other (limit: one 1-row INSERT per
  commit, one round trip);
- one writer, 100 events per append (limit: one 100-row INSERT ... unnest per commit);
- 8 coroutines sharing one EventStore, 1 event per append each (limit: 8 raw connections,
  one 1-row INSERT per commit each).

Events per second for each. The store and the raw connections take turns in blocks
(`BLOCKS` a case, or fewer so that a writer makes at least `LEAST` appends a block: the
same appends split among them), so both meet the disk at the same moments (an fsync's cost
drifts by several times within a minute on a shared machine); each figure is all its events
over all its blocks' time. Floors: >= 0.70 x raw for the
first two, >= 1.0 for the 8 writers (group commit). Without `--url` a server is started here
(fsync on).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from bench.common import (
    RAW_INSERT_UNNEST,
    RAW_TABLE,
    Figure,
    Floor,
    Report,
    on_postgres,
    tick_drafts,
)
from pulse_core._events import encode_data, uuid7
from pulse_core.store import EventStore, open_event_store, parse_store_url

KEYS = 1000
BLOCKS = 10
LEAST = 50  # appends a writer makes in a block at least (8 writers settle into groups)


def raw_columns(start: int, count: int) -> list[list[object]]:
    drafts = tick_drafts(start, count, KEYS)
    rows = [(str(uuid7()), d.kind, d.key, 1, int(time.time() * 1000), d.origin, None,
             str(uuid7()), None, encode_data(d.data, "bench"), None) for d in drafts]
    return [list(column) for column in zip(*rows, strict=True)]


async def raw_connections(dsn: str, writers: int) -> list[psycopg.AsyncConnection[Any]]:
    """`writers` raw connections (autocommit, every statement prepared)."""
    return [await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0)
            for _ in range(writers)]


async def raw_run(conns: Sequence[psycopg.AsyncConnection[Any]], start: int, appends: int,
                  per: int) -> float:
    """Seconds for each of `conns` to commit `appends` INSERTs of `per` rows."""
    batches = [[raw_columns(start + (w * appends + a) * per, per) for a in range(appends)]
               for w in range(len(conns))]

    async def writer(conn: psycopg.AsyncConnection[Any],
                     mine: Sequence[list[list[object]]]) -> None:
        for columns in mine:
            await conn.execute(RAW_INSERT_UNNEST, columns)

    started = time.perf_counter()
    await asyncio.gather(*(writer(c, b) for c, b in zip(conns, batches, strict=True)))
    return time.perf_counter() - started


async def store_run(store: EventStore, start: int, writers: int, appends: int,
                    per: int) -> float:
    """Seconds for `writers` coroutines on `store` each to await `appends` appends."""
    batches = [[tick_drafts(start + (w * appends + a) * per, per, KEYS)
                for a in range(appends)] for w in range(writers)]

    async def writer(mine: Sequence[Sequence[object]]) -> None:
        for drafts in mine:
            await store.append(drafts)  # type: ignore[arg-type]

    started = time.perf_counter()
    await asyncio.gather(*(writer(b) for b in batches))
    return time.perf_counter() - started


async def in_turns(store: EventStore, dsn: str, *, start: int, writers: int, appends: int,
                   per: int) -> tuple[float, float]:
    """Events/s of the store and of raw connections, `appends` appends a writer each, taking
    turns in blocks (see the module's docstring): (store, raw)."""
    conns = await raw_connections(dsn, writers)
    try:
        await raw_run(conns, start, 1, per)  # the raw statement prepared on each connection
        block = max(appends // BLOCKS, min(appends, LEAST))
        store_s = raw_s = 0.0
        done = 0
        while done < appends:
            count = min(block, appends - done)
            at = start + writers * done * per
            store_s += await store_run(store, at, writers, count, per)
            raw_s += await raw_run(conns, at, count, per)
            done += count
        events = writers * appends * per
        return events / store_s, events / raw_s
    finally:
        for conn in conns:
            await conn.close()


async def measure(url: str, appends: int) -> Report:
    dsn = parse_store_url(url).dsn  # type: ignore[attr-defined]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(RAW_TABLE)
    store = await open_event_store(url)
    report = Report("pg_single: appends on PostgreSQL at low concurrency")
    start = 0
    try:
        # warm: connections, prepared plans
        await in_turns(store, dsn, start=start, writers=1, appends=50, per=1)
        start += 50
        cases: list[tuple[str, int, int, int, float]] = [
            ("1 writer, 1 event per append", 1, appends, 1, 0.70),
            ("1 writer, 100 events per append", 1, max(1, appends // 10), 100, 0.70),
            ("8 writers, 1 event per append", 8, max(1, appends // 8), 1, 1.0)]
        for label, writers, count, per, floor in cases:
            store_rate, raw_rate = await in_turns(
                store, dsn, start=start, writers=writers, appends=count, per=per)
            start += writers * count * per
            report.compare(Figure(f"pulse {label}", store_rate, "events/s"),
                           Figure("raw psycopg INSERT per commit", raw_rate, "events/s"),
                           floor=Floor.ratio_at_least(store_rate / raw_rate, floor))
        report.note(f"pulse and raw took turns in up to {BLOCKS} blocks a case, of at least "
                    f"{LEAST} appends a writer")
    finally:
        await store.close()
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--appends", type=int, default=1000)
    parser.add_argument("--url", default=None)
    args = parser.parse_args(argv)
    return on_postgres(args.url, lambda url: measure(url, args.appends))


if __name__ == "__main__":
    sys.exit(main())
