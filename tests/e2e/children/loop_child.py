"""Child of test_two_processes: a bare ExecutorLoop (no Engine, no home lock) over events.db.

Prints `ready <pid> <owner>` once running; on SIGTERM drains, closes the store, prints
`stopped <interrupted>` and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from pathlib import Path

from workload import PidJournalExecutor, watchdog

from pulse_core import ExecutorLoop, SqliteEventStore


async def main(args: argparse.Namespace) -> None:
    store = await SqliteEventStore.open(Path(args.home) / "events.db")
    loop = ExecutorLoop(store, [PidJournalExecutor(Path(args.journal), args.work_seconds)],
                        concurrency=args.concurrency, scan_interval=args.scan_interval)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    guard = asyncio.create_task(watchdog(args.max_seconds))
    runner = asyncio.create_task(loop.run())
    print(f"ready {os.getpid()} {loop.owner}", flush=True)
    await stop.wait()
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    interrupted = await loop.drain(5.0)
    await store.close()
    guard.cancel()
    print(f"stopped {interrupted}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("home")
    parser.add_argument("journal")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--scan-interval", type=float, default=0.05)
    parser.add_argument("--work-seconds", type=float, default=0.01)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    asyncio.run(main(parser.parse_args()))
