"""The process bench.idle measures: an idle Engine with watchers, or a bare asyncio loop.

    python -m bench.idle_child engine --home DIR --seconds 60 [--watchers 4] [--interval 5]
    python -m bench.idle_child asyncio --seconds 60

Prints `ready` (for the engine: and its watchers) once set up, the engine open and started;
stays up `--seconds`, then exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pulse_core import Engine, Watcher


class LoadWatcher(Watcher):
    """A cheap, real reading: the one-minute load average."""

    def __init__(self, index: int, interval: float) -> None:
        self.name = f"load-{index}"
        self.interval = interval
        super().__init__()

    async def collect(self) -> Any:
        return {"load1": os.getloadavg()[0]}


async def idle_engine(home: Path, seconds: float, watchers: int, interval: float) -> None:
    engine = Engine(home, watchers=[LoadWatcher(i, interval) for i in range(watchers)])
    async with engine:
        names = ",".join(w.name for w in engine.watchers)
        print(f"ready {len(engine.watchers)} watchers: {names}", flush=True)
        await asyncio.sleep(seconds)


async def idle_asyncio(seconds: float) -> None:
    print("ready", flush=True)
    await asyncio.sleep(seconds)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.idle_child", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("engine", "asyncio"))
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--watchers", type=int, default=4)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.mode == "asyncio":
        asyncio.run(idle_asyncio(args.seconds))
    else:
        if args.home is None:
            parser.error("engine mode needs --home")
        asyncio.run(idle_engine(args.home, args.seconds, args.watchers, args.interval))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
