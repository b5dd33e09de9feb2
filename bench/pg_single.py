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

Events per second for each; the store and raw runs alternate three times and the best of
each is taken (the machine is shared). Floors: >= 0.70 x raw for the first two, >= 1.0 for
the 8 writers (group commit). Without `--url` a server is started here (fsync on).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

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
ROUNDS = 3


def raw_columns(start: int, count: int) -> list[list[object]]:
    drafts = tick_drafts(start, count, KEYS)
    rows = [(str(uuid7()), d.kind, d.key, 1, int(time.time() * 1000), d.origin, None,
             str(uuid7()), None, encode_data(d.data, "bench"), None) for d in drafts]
    return [list(column) for column in zip(*rows, strict=True)]


async def raw_run(dsn: str, writers: int, appends: int, per: int) -> float:
    """Events/s of `writers` connections, each committing `appends` INSERTs of `per` rows."""
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0)
             for _ in range(writers)]
    try:
        batches = [[raw_columns((w * appends + a) * per, per) for a in range(appends)]
                   for w in range(writers)]

        async def writer(conn: psycopg.AsyncConnection[tuple[object, ...]],
                         mine: Sequence[list[list[object]]]) -> None:
            for columns in mine:
                await conn.execute(RAW_INSERT_UNNEST, columns)

        started = time.perf_counter()
        await asyncio.gather(*(writer(c, b) for c, b in zip(conns, batches, strict=True)))
        return writers * appends * per / (time.perf_counter() - started)
    finally:
        for conn in conns:
            await conn.close()


async def store_run(store: EventStore, offset: int, writers: int, appends: int,
                    per: int) -> float:
    """Events/s of `writers` coroutines on `store`, each awaiting `appends` appends."""
    batches = [[tick_drafts(offset + (w * appends + a) * per, per, KEYS)
                for a in range(appends)] for w in range(writers)]

    async def writer(mine: Sequence[Sequence[object]]) -> None:
        for drafts in mine:
            await store.append(drafts)  # type: ignore[arg-type]

    started = time.perf_counter()
    await asyncio.gather(*(writer(b) for b in batches))
    return writers * appends * per / (time.perf_counter() - started)


async def measure(url: str, appends: int) -> Report:
    dsn = parse_store_url(url).dsn  # type: ignore[attr-defined]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(RAW_TABLE)
    store = await open_event_store(url)
    report = Report("pg_single: appends on PostgreSQL at low concurrency")
    offset = 0
    try:
        await store_run(store, 0, 1, 50, 1)  # warm: connections, prepared plans
        await raw_run(dsn, 1, 50, 1)
        cases: list[tuple[str, int, int, int, float]] = [
            ("1 writer, 1 event per append", 1, appends, 1, 0.70),
            ("1 writer, 100 events per append", 1, max(1, appends // 10), 100, 0.70),
            ("8 writers, 1 event per append", 8, max(1, appends // 8), 1, 1.0)]
        for label, writers, count, per, floor in cases:
            best_store = best_raw = 0.0
            for _ in range(ROUNDS):
                runs: list[Callable[[], Awaitable[float]]] = [
                    lambda w=writers, c=count, p=per, o=offset: store_run(store, o, w, c, p),
                    lambda w=writers, c=count, p=per: raw_run(dsn, w, c, p)]
                offset += writers * count * per
                s, r = [await run() for run in runs]
                best_store, best_raw = max(best_store, s), max(best_raw, r)
            ratio = best_store / best_raw
            report.compare(Figure(f"pulse {label}", best_store, "events/s"),
                           Figure("raw psycopg INSERT per commit", best_raw, "events/s"),
                           floor=Floor.ratio_at_least(ratio, floor))
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
