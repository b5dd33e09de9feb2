"""asyncpg beside psycopg 3 (async) on one PostgreSQL server: which driver the recorder uses.

    python -m bench.pg_drivers [--url postgresql://...] [--rounds 2000] [--fsync]

Each measured with both drivers against the same database, in turn: a 1-row INSERT +
COMMIT, a 100-row batched INSERT (executemany) in one transaction, the same 100 rows by COPY,
and a LISTEN/NOTIFY round trip (NOTIFY on one connection, received on another). Without
`--url` a server is started here (tests/servers.py, fsync off unless `--fsync`). No floor:
these figures are part of why the PostgreSQL recorder uses psycopg 3 (besides its own type
hints, pipeline mode and COPY; see pulse_core/store/_postgres.py).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import fmt, median, percentile

TABLE = ("CREATE TABLE IF NOT EXISTS {t} (seq bigint PRIMARY KEY, id text NOT NULL, "
         "kind text NOT NULL, key text NOT NULL, version bigint NOT NULL, ts bigint NOT NULL, "
         "origin text NOT NULL, cause bigint, tx text NOT NULL, idem text, data bytea, "
         "hash text)")
ROW = ("id-{n}", "tick", "k", 1, 0, "agent", None, "tx", None, b'{"n":1}', None)


async def _timed(rounds: int, once: Callable[[int], Awaitable[None]]) -> list[float]:
    times = []
    for n in range(rounds):
        started = time.perf_counter()
        await once(n)
        times.append(time.perf_counter() - started)
    return times


async def asyncpg_figures(url: str, rounds: int) -> dict[str, list[float]]:
    asyncpg: Any = importlib.import_module("asyncpg")  # optional: not among the test extras

    conn = await asyncpg.connect(url)
    other = await asyncpg.connect(url)
    try:
        await conn.execute("DROP TABLE IF EXISTS bench_apg")
        await conn.execute(TABLE.format(t="bench_apg"))
        insert = "INSERT INTO bench_apg VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12)"
        seq = 0

        async def one(n: int) -> None:
            nonlocal seq
            seq += 1
            async with conn.transaction():
                await conn.execute(insert, seq, *ROW)

        async def hundred(n: int) -> None:
            nonlocal seq
            rows = [(seq + i + 1, *ROW) for i in range(100)]
            seq += 100
            async with conn.transaction():
                await conn.executemany(insert, rows)

        async def copy100(n: int) -> None:
            nonlocal seq
            rows = [(seq + i + 1, *ROW) for i in range(100)]
            seq += 100
            async with conn.transaction():
                await conn.copy_records_to_table("bench_apg", records=rows)

        got: asyncio.Queue[str] = asyncio.Queue()
        await other.add_listener("bench", lambda *args: got.put_nowait(args[3]))

        async def notify(n: int) -> None:
            await conn.execute(f"NOTIFY bench, '{n}'")
            await got.get()

        return {"1-row commit": await _timed(rounds, one),
                "100-row executemany commit": await _timed(max(1, rounds // 10), hundred),
                "100-row COPY commit": await _timed(max(1, rounds // 10), copy100),
                "notify round trip": await _timed(rounds, notify)}
    finally:
        await conn.execute("DROP TABLE IF EXISTS bench_apg")
        await conn.close()
        await other.close()


async def psycopg_figures(url: str, rounds: int) -> dict[str, list[float]]:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    other = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        await conn.execute("DROP TABLE IF EXISTS bench_pg3")
        await conn.execute(TABLE.format(t="bench_pg3"))
        insert = "INSERT INTO bench_pg3 VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
        seq = 0

        async def one(n: int) -> None:
            nonlocal seq
            seq += 1
            async with conn.transaction():
                await conn.execute(insert, (seq, *ROW), prepare=True)

        async def hundred(n: int) -> None:
            nonlocal seq
            rows = [(seq + i + 1, *ROW) for i in range(100)]
            seq += 100
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(insert, rows)

        async def copy100(n: int) -> None:
            nonlocal seq
            rows = [(seq + i + 1, *ROW) for i in range(100)]
            seq += 100
            async with conn.transaction(), conn.cursor() as cur, cur.copy(
                    "COPY bench_pg3 FROM STDIN") as copy:
                for row in rows:
                    await copy.write_row(row)

        await other.execute("LISTEN bench")
        notifies = other.notifies()

        async def notify(n: int) -> None:
            await conn.execute(f"NOTIFY bench, '{n}'")
            await anext(notifies)

        return {"1-row commit": await _timed(rounds, one),
                "100-row executemany commit": await _timed(max(1, rounds // 10), hundred),
                "100-row COPY commit": await _timed(max(1, rounds // 10), copy100),
                "notify round trip": await _timed(rounds, notify)}
    finally:
        await conn.execute("DROP TABLE IF EXISTS bench_pg3")
        await conn.close()
        await other.close()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_drivers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="a database to use (default: start one)")
    parser.add_argument("--rounds", type=int, default=2_000, help="round trips of each kind")
    parser.add_argument("--fsync", action="store_true", help="started server: fsync on")
    return parser.parse_args(argv)


async def compare(url: str, rounds: int) -> None:
    figures = {"asyncpg": await asyncpg_figures(url, rounds),
               "psycopg 3": await psycopg_figures(url, rounds)}
    print("== PostgreSQL drivers: median / p99 per round trip (ms), the same server ==")
    for what in figures["asyncpg"]:
        parts = []
        for driver, results in figures.items():
            times = results[what]
            parts.append(f"{driver} {fmt(median(times) * 1e3)} / "
                         f"{fmt(percentile(times, 99) * 1e3)}")
        apg, pg3 = (median(figures[d][what]) for d in figures)
        print(f"{what}: {' | '.join(parts)} | psycopg/asyncpg {fmt(pg3 / apg)}x")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if importlib.util.find_spec("asyncpg") is None:
        print("bench.pg_drivers needs asyncpg, which pulse does not depend on: "
              "pip install asyncpg", file=sys.stderr)
        return 2
    if args.url:
        asyncio.run(compare(args.url, args.rounds))
        return 0
    from tests.servers import PostgresServer

    with tempfile.TemporaryDirectory(prefix="pulse-bench-pg-") as root:
        os.chmod(root, 0o755)
        server = PostgresServer(Path(root) / "pg", fsync=args.fsync).init()
        try:
            asyncio.run(compare(server.url(), args.rounds))
        finally:
            server.stop("immediate")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
