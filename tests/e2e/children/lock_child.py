"""Child of test_home_lock: an Engine that holds `home` and keeps ticking.

A rule emits one Work effect per tick (every 100 ms) and an executor runs it, so the log
grows while this engine lives. Prints `ready` once open; on SIGTERM closes the engine
(drain, checkpoint, `engine-stopped`), prints `stopped` and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from workload import PidJournalExecutor, Work, watchdog

from pulse_core import Decision, Engine, Inner, Snapshot


async def work_every_tick(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    """One Work effect per tick, ticking every 100 ms."""
    effects, _ = await inner(prev, curr)
    return Decision([*effects, Work(n=curr.number)], 100)


async def main(args: argparse.Namespace) -> None:
    engine = Engine(args.home, rules=[work_every_tick],
                    executors=[PidJournalExecutor(Path(args.journal), 0.0)],
                    executor_scan_interval=0.05)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    guard = asyncio.create_task(watchdog(args.max_seconds))
    async with engine:
        print("ready", flush=True)
        await stop.wait()
    guard.cancel()
    print("stopped", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("home")
    parser.add_argument("journal")
    parser.add_argument("--max-seconds", type=float, default=60.0)
    asyncio.run(main(parser.parse_args()))
