"""A stand-in for one host of a fleet: an Engine in a process of its own, with its own home
folder and host name, on a store URL the other hosts share.

    python tests/fleet/engine_host.py HOME STORE_URL --host NAME --journal FILE [options]

It runs `Work` effects (and `HostWork` bound to its host) with `JournalWorker`, which writes
one line per execution to the journal (a trace outside the log: at-least-once execution
shows there, exactly-once acks in the log). Prints `ready <pid> <owner>` once running. On
SIGTERM it prints `loops <json>` (every supervised loop and its state at that moment),
closes the engine, prints `stopped` and exits 0. It ends itself if its parent goes away or
it outlives --max-seconds.

Importable too: the tests take the effects and `read_journal` from here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import ClassVar

import msgspec

from pulse_core import Effect, Engine, ExecutionContext, Executor
from pulse_core._run import stop_signals


class Work(Effect, tag="fleet-work"):
    """A unit of work numbered `n`, for any host of the fleet."""

    any_host: ClassVar[bool] = True
    n: int


class HostWork(Effect, tag="fleet-host-work"):
    """A unit of work numbered `n` that only the engines of the host it names may run."""

    n: int


class Execution(msgspec.Struct, frozen=True, array_like=True):
    """One journal line: which host and process began which attempt of which effect."""

    host: str
    pid: int
    effect_id: str
    attempt: int


def read_journal(path: Path) -> list[Execution]:
    """Every execution the journal records (an absent journal records none)."""
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    return [msgspec.json.decode(line, type=Execution) for line in lines if line.strip()]


class JournalWorker(Executor):
    """Runs `Work` and `HostWork`: writes an Execution line on entry (one O_APPEND write,
    atomic between processes), then works `work_s` seconds; the first attempt of every effect
    works `first_attempt_s` instead when that is given (so a test can kill a host
    mid-effect)."""

    handles: ClassVar[tuple[type[Effect], ...]] = (Work, HostWork)
    max_attempts = 5

    def __init__(self, journal: Path, host: str, *, work_s: float = 0.0,
                 first_attempt_s: float | None = None, timeout: float = 60.0) -> None:
        self.journal = journal
        self.host = host
        self.work_s = work_s
        self.first_attempt_s = first_attempt_s
        self.timeout = timeout

    async def execute(self, effect: Work | HostWork, ctx: ExecutionContext
                      ) -> dict[str, int | str]:
        line = msgspec.json.encode(Execution(self.host, os.getpid(), ctx.effect_id, ctx.attempt))
        fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line + b"\n")
        finally:
            os.close(fd)
        first = ctx.attempt == 1 and self.first_attempt_s is not None
        await asyncio.sleep(self.first_attempt_s if first and self.first_attempt_s else self.work_s)
        return {"n": effect.n, "host": self.host}


async def _watchdog(max_seconds: float) -> None:
    """End this process if its parent goes away or it outlives `max_seconds`: no orphans."""
    parent = os.getppid()
    for _ in range(int(max_seconds / 0.2)):
        if os.getppid() != parent:
            break
        await asyncio.sleep(0.2)
    os._exit(3)


async def main(args: argparse.Namespace) -> None:
    worker = JournalWorker(Path(args.journal), args.host, work_s=args.work_seconds,
                           first_attempt_s=args.first_attempt_seconds, timeout=args.timeout)
    engine = Engine(args.home, store=args.store, host=args.host, executors=[worker],
                    executor_concurrency=args.concurrency,
                    executor_scan_interval=args.scan_interval, default_tick_ms=1_000,
                    heartbeat_s=args.heartbeat_seconds)
    guard = asyncio.create_task(_watchdog(args.max_seconds))
    async with stop_signals() as received:
        await engine.open()
        try:
            engine.executor_loop.lease_grace_ms = args.lease_grace_ms
            await engine.start()
            print(f"ready {os.getpid()} {engine.executor_loop.owner}", flush=True)
            await received
            loops = msgspec.json.encode(engine.loops()).decode()
            print(f"loops {loops}", flush=True)
        finally:
            await engine.close()
    guard.cancel()
    print("stopped", flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("home")
    parser.add_argument("store", help="the store URL every host shares")
    parser.add_argument("--host", required=True, help="this host's name in its claims")
    parser.add_argument("--journal", required=True, help="file of one line per execution")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--scan-interval", type=float, default=0.5)
    parser.add_argument("--work-seconds", type=float, default=0.0)
    parser.add_argument("--first-attempt-seconds", type=float, default=None)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="the executor's timeout: with --lease-grace-ms, the lease")
    parser.add_argument("--lease-grace-ms", type=int, default=5_000)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--heartbeat-seconds", type=float, default=60.0,
                        help="how often the engine records its heartbeat")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
