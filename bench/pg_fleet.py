"""A fleet on one PostgreSQL log: several engine processes claim and ack effects, one of them
SIGKILLed mid-run and started again; every effect must be acked exactly once.

    python -m bench.pg_fleet [--engines 3] [--effects 3000] [--rate 300] [--url ...]

Each engine process runs an ExecutorLoop over `open_event_store(url)` (4 effects at once),
woken by LISTEN/NOTIFY; its executor prints `<n> <perf_counter>` when entered. This process
appends `--effects` effects at `--rate` a second (paced, one append each, as ticks would), t0
taken when each append returns. Halfway, one engine is SIGKILLed (claims it held are taken
again by the others once they see its process gone) and a new one started. Then every effect
must have exactly one `effect-acked` and no `effect-failed` in the log.

Dispatch latency: t0 -> the first entry of that effect in any engine (one clock: perf_counter
is CLOCK_MONOTONIC for the machine). Limit, same run, same server: a raw 1-row INSERT +
COMMIT (psycopg), what one claim's commit costs without pulse. Floors: dispatch p99 < 20 ms
(the fleet goal), every effect acked once. Appends: the producer's events/s beside the
offered rate. Without `--url` a server is started here (tests/servers.py, fsync on).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.common import (
    REPO,
    Figure,
    Floor,
    Ping,
    Report,
    executor_process,
    on_postgres,
    percentile,
)
from bench.pg_dispatch import raw_commit_latencies
from pulse_core._effects import effect_draft
from pulse_core.store import open_event_store

GOAL_P99_MS = 20.0


class Engine:
    """One engine child process; its entries go into the shared `entered` map."""

    def __init__(self, proc: asyncio.subprocess.Process, entered: dict[int, float],
                 counts: dict[int, int]) -> None:
        self.proc = proc
        self.reader = asyncio.create_task(self._read(entered, counts))

    @classmethod
    async def start(cls, url: str, entered: dict[int, float], counts: dict[int, int]
                    ) -> Engine:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.pg_fleet", "--role", "engine", "--url", url,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=REPO)
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().strip()
        if line != "ready":
            raise RuntimeError(f"engine did not start: said {line!r}")
        return cls(proc, entered, counts)

    async def _read(self, entered: dict[int, float], counts: dict[int, int]) -> None:
        assert self.proc.stdout is not None
        while raw := await self.proc.stdout.readline():
            said, at = raw.decode().split()
            n = int(said)
            entered.setdefault(n, float(at))
            counts[n] = counts.get(n, 0) + 1

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)

    async def stop(self) -> None:
        if self.proc.returncode is None and self.proc.stdin is not None:
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
        await self.proc.wait()
        await self.reader


async def run(url: str, args: argparse.Namespace) -> Report:
    report = Report(f"pg_fleet: {args.engines} engine processes on one PostgreSQL log, "
                    f"{args.effects:,} effects at {args.rate}/s, one engine SIGKILLed "
                    "halfway (fsync on, loopback)")
    entered: dict[int, float] = {}
    counts: dict[int, int] = {}
    engines = [await Engine.start(url, entered, counts) for _ in range(args.engines)]
    store = await open_event_store(url)
    sent: dict[int, float] = {}
    try:
        started = time.perf_counter()
        for n in range(args.effects):
            due = started + n / args.rate
            if (wait := due - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            await store.append([effect_draft(Ping(n=n), origin="engine:tick")])
            sent[n] = time.perf_counter()
            if n == args.effects // 2:
                engines[0].kill()
                await engines[0].proc.wait()
                engines.append(await Engine.start(url, entered, counts))
        appended = args.effects / (time.perf_counter() - started)
        deadline = time.monotonic() + 120
        acks: dict[str, int] = {}
        failed = 0
        while time.monotonic() < deadline:
            acks, failed = await tally(store)
            if len(acks) >= args.effects:
                break
            await asyncio.sleep(0.2)  # polling the log for completion, not a measurement
    finally:
        for one in engines:
            await one.stop()
        await store.close()
    lat = [(entered[n] - sent[n]) * 1000 for n in sent if n in entered]
    commits = [s * 1000 for s in await raw_commit_latencies(url, 500)]
    for p in (50, 99):
        figure = Figure(f"dispatch p{p}", percentile(lat, p), "ms")
        limit = Figure(f"raw 1-row INSERT + COMMIT p{p}", percentile(commits, p), "ms")
        report.compare(figure, limit, floor=Floor.below(figure, GOAL_P99_MS, "p99")
                       if p == 99 else None)
    once = sum(1 for v in acks.values() if v == 1)
    report.compare(Figure("effects acked exactly once", once, "effects"),
                   Figure("effects appended", args.effects, "effects"),
                   floor=Floor("floor: all, none twice, none failed",
                               once == args.effects and len(acks) == once and not failed))
    report.compare(Figure("effects appended", appended, "/s"),
                   Figure("offered", args.rate, "/s"))
    again = sum(1 for v in counts.values() if v > 1)
    report.note(f"dispatch max {max(lat):.2f} ms; {again} effect(s) entered twice (claimed "
                "by the killed engine, taken again after it was gone); "
                f"{len(lat)} of {args.effects} entered")
    return report


async def tally(store: Any) -> tuple[dict[str, int], int]:
    """Acks per effect key, and the number of effect-failed events, in the log."""
    acks: dict[str, int] = {}
    failed = 0
    async for page in store.pages(0, kinds=["effect-acked", "effect-failed"]):
        for event in page.events:
            if event.kind == "effect-acked":
                acks[event.key] = acks.get(event.key, 0) + 1
            else:
                failed += 1
    return acks, failed


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_fleet", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--effects", type=int, default=3_000)
    parser.add_argument("--rate", type=float, default=300.0, help="effects a second")
    parser.add_argument("--url", default=None, help="an empty database (default: start one)")
    parser.add_argument("--role", choices=["engine"], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.role == "engine":  # one engine's executors, 4 effects at once
        asyncio.run(executor_process(args.url, concurrency=4))
        return 0
    return on_postgres(args.url, lambda url: run(url, args))


if __name__ == "__main__":
    raise SystemExit(main())
