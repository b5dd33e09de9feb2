"""A fleet on one PostgreSQL log: several engine processes claim and ack effects, one of them
SIGKILLed mid-run and started again, then the server itself restarted; every effect must be
acked exactly once.

    python -m bench.pg_fleet [--engines 3] [--effects 3000] [--rate 300] [--no-restart]
                             [--url ...]

Each engine process runs an ExecutorLoop over `open_event_store(url)` (4 effects at once),
woken by LISTEN/NOTIFY; its executor prints `<n> <perf_counter>` when entered. This process
appends `--effects` effects at `--rate` a second (paced, one append each, as ticks would: a
producer that fell behind goes on at the rate rather than in a burst), t0 taken when each
append returns. Halfway, one engine is SIGKILLed (claims it held are taken again by the
others once they see its process gone) and a new one started. Three quarters in, PostgreSQL
is restarted (`pg_ctl restart -m fast`: every connection cut) while the producer goes on
appending: an append refused as unavailable is made again with the same drafts (each has an
idempotency key) until it is stored, as a tick's would be. Then every effect must have
exactly one `effect-acked` and no `effect-failed` in the log.

Dispatch latency: t0 -> the first entry of that effect in any engine (one clock: perf_counter
is CLOCK_MONOTONIC for the machine). The effects the restart held up (appended before the
server was back and a second more for the engines to reconnect, and entered after it went
down) are counted apart from the rest: their longest wait is the outage as the fleet saw it.
Limit, same run, same server: a raw 1-row INSERT + COMMIT (psycopg), what one claim's commit
costs without pulse. Floors: dispatch p99 < 20 ms outside the restart (the fleet goal), every
effect acked once through the kill and the restart. Appends: the producer's events/s beside
the offered rate. Without `--url` a server is started here (tests/servers.py, fsync on); with
it there is no restart (the server is not this run's to restart).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from bench.common import (
    REPO,
    Figure,
    Floor,
    Ping,
    Report,
    executor_process,
    percentile,
    postgres_server,
)
from bench.pg_dispatch import raw_commit_latencies
from pulse_core import StoreUnavailable
from pulse_core._effects import effect_draft
from pulse_core.store import open_event_store

if TYPE_CHECKING:
    from tests.servers import PostgresServer

GOAL_P99_MS = 20.0


class Engine:
    """One engine child process; its entries go into the shared `entered` map."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str, entered: dict[int, float],
                 counts: dict[int, int]) -> None:
        self.proc = proc
        self.url, self.entered, self.counts = url, entered, counts
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
        return cls(proc, url, entered, counts)

    async def another(self) -> Engine:
        """A new engine on the same log, its entries in the same maps."""
        return await Engine.start(self.url, self.entered, self.counts)

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


RECONNECT_S = 1.0
"""After the server is back, how long the engines' reconnections count as the restart's."""
BEHIND_S = 0.5
"""How far behind its pace the producer may fall before it goes on from where it is."""


class Restart:
    """PostgreSQL restarted in a thread while the producer goes on: when it went down and
    when it was back (perf_counter)."""

    def __init__(self, server: PostgresServer) -> None:
        self.down = time.perf_counter()
        self.back: float | None = None
        self.task = asyncio.create_task(asyncio.to_thread(self._restart, server))

    def _restart(self, server: PostgresServer) -> None:
        server.restart("fast")
        self.back = time.perf_counter()

    def held_up(self, sent: float, entered: float) -> bool:
        """Whether an effect appended at `sent` and entered at `entered` waited on it."""
        assert self.back is not None
        return entered > self.down and sent < self.back + RECONNECT_S


async def run(url: str, args: argparse.Namespace, server: PostgresServer | None = None
              ) -> Report:
    report = Report(f"pg_fleet: {args.engines} engine processes on one PostgreSQL log, "
                    f"{args.effects:,} effects at {args.rate}/s, one engine SIGKILLed "
                    "halfway" + (", the server restarted three quarters in" if restart_at(
                        args, server) is not None else "") + " (fsync on, loopback)")
    entered: dict[int, float] = {}
    counts: dict[int, int] = {}
    engines = [await Engine.start(url, entered, counts) for _ in range(args.engines)]
    store = await open_event_store(url)
    sent: dict[int, float] = {}
    try:
        appended, restart, refused = await produce(store, engines, sent, args, server)
        if restart is not None:
            await restart.task
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
    held = {n for n in sent if n in entered and restart is not None
            and restart.held_up(sent[n], entered[n])}
    lat = [(entered[n] - sent[n]) * 1000 for n in sent if n in entered and n not in held]
    commits = [s * 1000 for s in await raw_commit_latencies(url, 500)]
    outside = " outside the restart" if restart is not None else ""
    for p in (50, 99):
        figure = Figure(f"dispatch p{p}{outside}", percentile(lat, p), "ms")
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
    report.note(f"dispatch max{outside} {max(lat):.2f} ms; {again} effect(s) entered twice "
                "(claimed by the killed engine, taken again after it was gone); "
                f"{len(entered)} of {args.effects} entered")
    if restart is not None and restart.back is not None:
        waited = max(((entered[n] - sent[n]) * 1000 for n in held), default=0.0)
        report.note(f"restart: the server was down {(restart.back - restart.down) * 1000:.0f} "
                    f"ms (pg_ctl restart -m fast); {len(held)} effect(s) held up by it, the "
                    f"longest dispatch among them {waited:.0f} ms; {refused} append(s) refused "
                    "as unavailable and made again")
    return report


def restart_at(args: argparse.Namespace, server: PostgresServer | None) -> int | None:
    """The effect after whose append the server is restarted (none: it is not ours)."""
    return args.effects * 3 // 4 if server is not None and args.restart else None


async def produce(store: Any, engines: list[Engine], sent: dict[int, float],
                  args: argparse.Namespace, server: PostgresServer | None
                  ) -> tuple[float, Restart | None, int]:
    """Append the effects at the rate into `sent` (n -> when its append returned), killing
    the first engine halfway and restarting `server` three quarters in; the append rate,
    the restart, and how many appends were refused as unavailable."""
    restart_after = restart_at(args, server)
    restart: Restart | None = None
    refused = 0
    started = time.perf_counter()
    for n in range(args.effects):
        due = started + n / args.rate
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        elif -wait > BEHIND_S:
            started -= wait  # behind (the restart): go on at the rate, not in a burst
        refused += await append_until_stored(store, n)
        sent[n] = time.perf_counter()
        if n == args.effects // 2:
            engines[0].kill()
            await engines[0].proc.wait()
            engines.append(await engines[0].another())
        if n == restart_after and server is not None:
            restart = Restart(server)
    return args.effects / (time.perf_counter() - started), restart, refused


async def append_until_stored(store: Any, n: int) -> int:
    """Append effect `n` (idempotency key `ping-<n>`), again while the store is unavailable;
    how many times it was refused."""
    draft = msgspec.structs.replace(effect_draft(Ping(n=n), origin="engine:tick"),
                                    idem=f"ping-{n}")
    refused = 0
    while True:
        try:
            await store.append([draft])
            return refused
        except StoreUnavailable:
            refused += 1
            await asyncio.sleep(0.05)  # the server is restarting: try again shortly


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
    parser.add_argument("--no-restart", dest="restart", action="store_false",
                        help="leave PostgreSQL running (no restart three quarters in)")
    parser.add_argument("--url", default=None,
                        help="an empty database (default: start one; no restart then)")
    parser.add_argument("--role", choices=["engine"], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.role == "engine":  # one engine's executors, 4 effects at once
        asyncio.run(executor_process(args.url, concurrency=4))
        return 0
    if args.url:
        return asyncio.run(run(args.url, args)).exit_code()
    with postgres_server() as server:
        return asyncio.run(run(server.create_database(), args, server)).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
