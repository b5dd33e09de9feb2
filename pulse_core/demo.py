"""`python -m pulse_core.demo`: an example engine, on a home of its own, with one example of
each part.

A watcher samples the load average, a rule turns every fifth tick (or a load spike) into a
`heartbeat` effect, an executor prints it. Everything lands in events.db under the demo's
home, the instance `demo` ($UPULSE_HOME/instances/demo, else ~/.upulse/instances/demo):
never the default home, whose log is the daemon's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
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
    PulseError,
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
    """Prints heartbeats to stdout and counts them."""

    handles = (Heartbeat,)
    timeout = 5.0

    def __init__(self) -> None:
        self.printed = 0

    async def execute(self, effect: Heartbeat, ctx: ExecutionContext) -> dict[str, str]:
        line = (f"heartbeat: tick {effect.tick}, load/core {effect.load}, "
                f"{effect.events} events in the log (effect {ctx.effect_id[-8:]})")
        print(line, flush=True)
        self.printed += 1
        return {"printed": line}


def default_home() -> Path:
    """The demo's own instance: $UPULSE_HOME/instances/demo, else ~/.upulse/instances/demo."""
    base = Path(os.environ.get("UPULSE_HOME") or Path.home() / ".upulse")
    return base / "instances" / "demo"


async def run(home: Path, seconds: float | None) -> int:
    """Run the demo engine until SIGTERM or Ctrl-C (or `seconds`), draining its effects;
    returns how many heartbeats it printed."""
    printer = PrintHeartbeat()
    engine = Engine(home, watchers=[LoadWatcher()], rules=[heartbeat_rule],
                    executors=[printer], default_tick_ms=1_000)
    print(f"pulse demo engine on {home} — Ctrl-C to stop", flush=True)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await engine.run_forever()
    print(f"stopped after {printer.printed} heartbeat(s); `upulse events --home {home}` "
          "lists what it recorded", flush=True)
    return printer.printed


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: 0 once stopped, 1 (with one line on stderr) when the demo cannot
    run on its home (another engine holds it, say)."""
    parser = argparse.ArgumentParser(prog="python -m pulse_core.demo", description=__doc__)
    parser.add_argument("--home", type=Path, default=default_home(),
                        help="home folder (default: the instance `demo`, "
                             "$UPULSE_HOME/instances/demo or ~/.upulse/instances/demo)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="stop after this many seconds (default: run until Ctrl-C)")
    args = parser.parse_args(argv)
    try:
        asyncio.run(run(args.home.expanduser(), args.seconds))
    except PulseError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
