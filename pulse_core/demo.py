"""`python -m pulse_core.demo`: an engine on the default home with one example of each part.

A watcher samples the load average, a rule turns every fifth tick (or a load spike) into a
`heartbeat` effect, an executor prints it. Everything lands in events.db under the home.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

from pulse_core import (
    Decision,
    Effect,
    Engine,
    ExecutionContext,
    Executor,
    Inner,
    Snapshot,
    Watcher,
)


class LoadWatcher(Watcher):
    """One-minute load average, per core."""

    name = "load"
    interval = 1.0

    async def collect(self) -> dict[str, float]:
        one, _, _ = os.getloadavg()
        return {"per_core": round(one / (os.cpu_count() or 1), 3)}

    def should_wake(self, window: Any) -> bool:
        return any(s.ok and s.data["per_core"] > 1.5 for s in window[-1:])


class Heartbeat(Effect, tag="heartbeat"):
    """Say that the agent is alive, with what the engine saw."""

    tick: int
    load: float | None
    events: int


async def heartbeat_rule(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    """Every fifth tick, or when load passes 1.5 per core, emit a heartbeat."""
    effects, tick_ms = await inner(prev, curr)
    reading = curr.vital("load")
    load = reading.sample.data["per_core"] if reading and reading.sample.ok else None
    if curr.number % 5 == 1 or (load is not None and load > 1.5):
        effects = [*effects, Heartbeat(tick=curr.number, load=load, events=curr.seq)]
    return Decision(effects, tick_ms)


class PrintHeartbeat(Executor):
    """Prints heartbeats to stdout."""

    handles = (Heartbeat,)
    timeout = 5.0

    async def execute(self, effect: Heartbeat, ctx: ExecutionContext) -> dict[str, str]:
        line = (f"heartbeat: tick {effect.tick}, load/core {effect.load}, "
                f"{effect.events} events in the log (effect {ctx.effect_id[-8:]})")
        print(line, flush=True)
        return {"printed": line}


def default_home() -> Path:
    """$UPULSE_HOME, else ~/.upulse."""
    return Path(os.environ.get("UPULSE_HOME") or Path.home() / ".upulse")


async def run(home: Path, seconds: float | None) -> int:
    """Run the demo engine until `seconds` pass (or forever); returns how many heartbeats."""
    engine = Engine(home, watchers=[LoadWatcher()], rules=[heartbeat_rule],
                    executors=[PrintHeartbeat()], default_tick_ms=1_000)
    print(f"pulse engine on {home} — Ctrl-C to stop", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)  # drain effects, then stop cleanly
    async with engine:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await stop.wait()
        acked = await engine.events.read(kinds=["effect-acked"])
    print(f"stopped; {len(acked)} effects acked in this home so far", flush=True)
    return len(acked)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry."""
    parser = argparse.ArgumentParser(prog="python -m pulse_core.demo", description=__doc__)
    parser.add_argument("--home", type=Path, default=default_home(),
                        help="home folder (default: $UPULSE_HOME or ~/.upulse)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="stop after this many seconds (default: run until Ctrl-C)")
    args = parser.parse_args(argv)
    asyncio.run(run(args.home.expanduser(), args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
