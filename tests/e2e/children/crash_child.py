"""Child of test_crash: an Engine on `home` that appends `count` Work effects and runs them.

Effects whose number is given with --block sleep in their first attempt, so the parent can
SIGKILL this process while they are in flight. Prints `ready` once the effects are appended.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from workload import JournalExecutor, Work, watchdog

from pulse_core import Engine
from pulse_core._effects import effect_draft


async def main(args: argparse.Namespace) -> None:
    executor = JournalExecutor(Path(args.journal), frozenset(args.block))
    engine = Engine(args.home, executors=[executor], executor_concurrency=args.concurrency,
                    executor_scan_interval=0.05)
    async with engine:
        await engine.append([effect_draft(Work(n=n), origin="agent") for n in range(args.count)])
        print("ready", flush=True)
        await watchdog(args.max_seconds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("home")
    parser.add_argument("journal")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--block", type=int, action="append", default=[])
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    asyncio.run(main(parser.parse_args()))
