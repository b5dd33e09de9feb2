"""Dispatch across processes on PostgreSQL: effect committed in one process -> claimed and
entered in another.

    python -m bench.pg_dispatch [--effects 2000] [--url postgresql://...]

A consumer process runs an ExecutorLoop over `open_event_store(url)`; it is woken by the
recorder's LISTEN/NOTIFY, reads the new effect, commits its claim (`effect-executing`) and
enters the executor, which prints `time.perf_counter()`. This process appends one effect at a
time; t0 is taken when its append returns (committed); the next effect is appended once the
previous one is acked, so each sample is one effect's latency, not a queue's. Both processes
read the same clock (perf_counter is CLOCK_MONOTONIC on Linux, one clock for the machine).

Limit, measured in the same run with the driver the recorder uses (psycopg 3, async): a bare
NOTIFY sent from this process -> the notification delivered to a LISTEN connection in another
process, and the full round trip (the other process NOTIFYs back at once). Delivery happens
as the NOTIFY commits, about when the sender hears its own commit, so the one-way limit is
timed from the send (from when it returns it is ~0 and says nothing). A raw 1-row INSERT +
COMMIT into a table with the log's columns and indexes is printed too, for context: each
dispatch makes one durable commit (the claim). Without `--url`, a server is started here
(tests/servers.py, fsync on).
Floor: dispatch p99 < 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence

import psycopg

from bench.common import (
    RAW_INSERT,
    RAW_TABLE,
    REPO,
    Figure,
    Floor,
    Ping,
    Report,
    executor_process,
    on_postgres,
    percentile,
)
from pulse_core._effects import effect_draft
from pulse_core.store import EventStore, open_event_store

FLOOR_P99_MS = 50.0
WARMUP = 50
"""Round trips of each kind made before measuring (connections, prepared statements)."""
CHANNEL = "pulse_bench_ping"
ECHO = "pulse_bench_pong"


# -- the other process -----------------------------------------------------------------------


async def listener(url: str) -> None:
    """The bare LISTEN side: prints `<payload> <perf_counter>` per notification and NOTIFYs
    the payload back on another channel, until stdin closes."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    back = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await conn.execute(f"LISTEN {CHANNEL}")

    async def echo() -> None:
        async for note in conn.notifies():
            now = time.perf_counter()
            sys.stdout.write(f"{note.payload} {now!r}\n")
            sys.stdout.flush()
            await back.execute("SELECT pg_notify(%s, %s)", (ECHO, note.payload))

    echoing = asyncio.create_task(echo())
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    echoing.cancel()
    await asyncio.gather(echoing, return_exceptions=True)
    await conn.close()
    await back.close()


# -- this process ----------------------------------------------------------------------------


class Other:
    """One child process of this benchmark in `role`, its stdout read line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, role: str, url: str) -> Other:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.pg_dispatch", "--role", role, "--url", url,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            cwd=REPO)
        other = cls(proc)
        line = await other.line()
        if line != "ready":
            raise RuntimeError(f"{role} process did not start: said {line!r}")
        return other

    async def line(self, within: float = 30.0) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), within)
        if not raw:
            raise RuntimeError(f"child exited {await self.proc.wait()}")
        return raw.decode().strip()

    async def entered(self, n: int) -> float:
        """When the child said it got number `n`."""
        said, at = (await self.line()).split()
        if int(said) != n:
            raise RuntimeError(f"expected number {n}, the child said {said}")
        return float(at)

    async def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


async def acked(store: EventStore, signal: asyncio.Event, key: str) -> None:
    """Wait until effect `key` has its ack (effect, effect-executing, effect-acked)."""
    while True:
        signal.clear()
        if await store.head(key) >= 3:
            return
        await asyncio.wait_for(signal.wait(), 10)


async def dispatch_latencies(url: str, count: int) -> list[float]:
    """Seconds from append returning here to executor entry in the consumer, per effect."""
    store = await open_event_store(url)
    committed = store.subscribe()  # woken by the consumer's commits (LISTEN/NOTIFY)
    other = await Other.start("consumer", url)
    out: list[float] = []
    try:
        for n in range(WARMUP + count):
            result = await store.append([effect_draft(Ping(n=n), origin="engine:tick")])
            t0 = time.perf_counter()
            t1 = await other.entered(n)
            if n >= WARMUP:
                out.append(t1 - t0)
            await acked(store, committed, result.events[0].key)
    finally:
        store.unsubscribe(committed)
        await other.stop()
        await store.close()
    return out


async def notify_latencies(url: str, count: int) -> tuple[list[float], list[float]]:
    """Seconds from NOTIFY sent here to delivery in the listener process, and to the echo
    heard back here, per round."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await conn.execute(f"LISTEN {ECHO}")
    echoes: asyncio.Queue[tuple[str, float]] = asyncio.Queue()

    async def hear() -> None:
        async for note in conn.notifies():
            echoes.put_nowait((note.payload, time.perf_counter()))

    hearing = asyncio.create_task(hear())
    sender = await psycopg.AsyncConnection.connect(url, autocommit=True)
    other = await Other.start("listener", url)
    one_way: list[float] = []
    round_trip: list[float] = []
    try:
        for n in range(WARMUP + count):
            sent = time.perf_counter()
            await sender.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(n)))
            t1 = await other.entered(n)
            payload, back = await asyncio.wait_for(echoes.get(), 10)
            if payload != str(n):
                raise RuntimeError(f"echo of {n} came back as {payload}")
            if n >= WARMUP:
                one_way.append(t1 - sent)
                round_trip.append(back - sent)
    finally:
        await other.stop()
        hearing.cancel()
        await asyncio.gather(hearing, return_exceptions=True)
        await conn.close()
        await sender.close()
    return one_way, round_trip


async def raw_commit_latencies(url: str, count: int) -> list[float]:
    """Seconds per 1-row INSERT + COMMIT, one at a time, into the raw table (the log's
    columns and indexes, bench.common.RAW_TABLE): what the claim's commit costs without
    pulse."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    out: list[float] = []
    try:
        await conn.execute(RAW_TABLE)
        for n in range(1, WARMUP + count + 1):
            started = time.perf_counter()
            async with conn.transaction():
                await conn.execute(RAW_INSERT, (
                    f"id-{n}", "effect-executing", f"key-{n}", 2, 0, "bench", 1, f"tx-{n}",
                    None, b'{"attempt":1,"lease_until":0}', None))
            if n > WARMUP:
                out.append(time.perf_counter() - started)
    finally:
        await conn.close()
    return out


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_dispatch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--effects", type=int, default=2_000,
                        help="effects, and bare notifications (default 2,000)")
    parser.add_argument("--url", default=None, help="an empty database (default: start one)")
    parser.add_argument("--role", choices=["consumer", "listener"], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


async def run(url: str, args: argparse.Namespace) -> Report:
    report = Report(f"pg_dispatch: effect committed in one process -> claimed and entered in "
                    f"another, {args.effects:,} effects (PostgreSQL fsync on, psycopg, loopback)")
    dispatch = await dispatch_latencies(url, args.effects)
    one_way, round_trip = await notify_latencies(url, args.effects)
    commits = await raw_commit_latencies(url, args.effects)
    for p in (50, 99):
        figure = Figure(f"dispatch p{p}", percentile(dispatch, p) * 1000, "ms")
        limit = Figure(f"bare NOTIFY sent -> heard in another process p{p}",
                       percentile(one_way, p) * 1000, "ms")
        floor = Floor.below(figure, FLOOR_P99_MS, "p99") if p == 99 else None
        report.compare(figure, limit, floor=floor)
    for p in (50, 99):
        figure = Figure(f"dispatch p{p}", percentile(dispatch, p) * 1000, "ms")
        limit = Figure(f"bare NOTIFY round trip p{p}", percentile(round_trip, p) * 1000, "ms")
        report.compare(figure, limit)
    for p in (50, 99):
        figure = Figure(f"dispatch p{p}", percentile(dispatch, p) * 1000, "ms")
        limit = Figure(f"raw 1-row INSERT + COMMIT p{p}", percentile(commits, p) * 1000, "ms")
        report.compare(figure, limit)
    report.note(f"dispatch max {max(dispatch) * 1000:.2f} ms; between commit and entry the "
                "consumer is woken by NOTIFY, reads the new events and commits its claim")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.role == "consumer":  # the claiming process, one effect at a time
        asyncio.run(executor_process(args.url, concurrency=1))
        return 0
    if args.role == "listener":
        asyncio.run(listener(args.url))
        return 0
    return on_postgres(args.url, lambda url: run(url, args))


if __name__ == "__main__":
    raise SystemExit(main())
