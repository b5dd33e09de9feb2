"""A stand-in for one host of a reviewer fleet: an Engine in a process of its own, built from
its home's config.json as the daemon builds it (the shared PostgreSQL log, the Redis side
store, its host name, the awareness layer).

    python tests/fleet/reviewer_host.py HOME [--concurrency N] [--max-seconds S]

Prints `ready <pid> <owner>` once running; on SIGTERM closes the engine, prints `stopped` and
exits 0. It ends itself if its parent goes away or it outlives --max-seconds. `--concurrency`
is how many reviews its executor loop runs at once: a burst of reviews of a model that
answers in milliseconds is bound by it, not by the model.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from pulse_cli.assembly import NO_CODE, build_engine
from pulse_cli.config import load
from pulse_core._run import stop_signals


async def _watchdog(max_seconds: float) -> None:
    """End this process if its parent goes away or it outlives `max_seconds`: no orphans."""
    parent = os.getppid()
    for _ in range(int(max_seconds / 0.2)):
        if os.getppid() != parent:
            break
        await asyncio.sleep(0.2)
    os._exit(3)


async def main(args: argparse.Namespace) -> None:
    home = Path(args.home)
    engine = build_engine(home, load(home / "config.json"), NO_CODE)
    engine.executor_concurrency = args.concurrency
    guard = asyncio.create_task(_watchdog(args.max_seconds))
    async with stop_signals() as received:
        await engine.open()
        try:
            await engine.start()
            print(f"ready {os.getpid()} {engine.executor_loop.owner}", flush=True)
            await received
        finally:
            await engine.close()
    guard.cancel()
    print("stopped", flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("home", help="a home folder whose config.json names the fleet's stores")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-seconds", type=float, default=150.0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
