"""`upulse events --causes` (why each listed event is in the log) and `upulse fleet` (the
engines that write this home's log: their state, loops, last tick and leases)."""

from __future__ import annotations

from typing import Any

import msgspec

from pulse_cli.home import Home
from pulse_cli.output import (
    ago,
    clip,
    now_ms,
    print_json,
    print_table,
    printable,
    table,
    to_json,
)
from pulse_cli.stores import opened
from pulse_core import Causes, EngineInstance, Event, EventStore, causes_of, fleet_json, read_fleet


def causes_view(causes: Causes) -> dict[str, Any]:
    """An event's Causes as `upulse events --causes --json` adds them to it: `tick`, the tick
    that decided it (or null), and `causes`, its chain nearest first (a cause that cannot be
    read ends it as `{"seq", "missing": true}`)."""
    chain: list[Any] = [msgspec.to_builtins(e) for e in causes.chain]
    if causes.missing is not None:
        chain.append({"seq": causes.missing, "missing": True})
    return {"tick": None if causes.tick is None else msgspec.to_builtins(causes.tick),
            "causes": chain}


async def event_causes(store: EventStore, event: Event) -> dict[str, Any]:
    """The Causes of `event` as causes_view gives them."""
    return causes_view(await causes_of(store, event))


def cause_lines(view: dict[str, Any]) -> list[str]:
    """The lines printed under an event of `upulse events --causes`: each cause, nearest
    first, then the tick that decided the last of them (or the event)."""
    lines = []
    for cause in view["causes"]:
        if cause.get("missing"):
            lines.append(f"    <- #{cause['seq']} (not readable)")
        else:
            lines.append(f"    <- #{cause['seq']} {cause['kind']} {clip(cause['key'], 40)} "
                         f"{cause['origin']} {clip(to_json(cause['data']), 60)}")
    tick = view["tick"]
    if tick is not None:
        lines.append(f"    <- decided by tick {tick['data'].get('number')} (#{tick['seq']})")
    return [printable(line) for line in lines]


async def print_with_causes(store: EventStore, headers: tuple[str, ...],
                            rows: list[tuple[Event | None, list[str]]], empty: str) -> None:
    """A table of `rows` (an event, or None for a row that cannot be read, and its cells),
    each event followed by its cause_lines."""
    if not rows:
        print(empty)
        return
    header, *lines = table(headers, [cells for _, cells in rows]).split("\n")
    print(header)
    for line, (event, _) in zip(lines, rows, strict=True):
        print(line)
        if event is not None:
            for cause in cause_lines(await event_causes(store, event)):
                print(cause)


def _loops(engine: EngineInstance) -> str:
    if not engine.loops:
        return "-"
    # the running ones are counted, the others named: what an operator looks for
    running = sum(loop.state == "running" for loop in engine.loops)
    others = [f"{loop.name}:{loop.state}" for loop in engine.loops if loop.state != "running"]
    return ", ".join([f"{running} running", *others])


async def fleet(home: Home, *, as_json: bool) -> int:
    """Print the engines that write this home's log (pulse_core.read_fleet)."""
    async with opened(home, read_only=True) as stores:
        now = now_ms()
        engines = await read_fleet(stores.events, now)
    if as_json:
        print_json({"now": now, "engines": fleet_json(engines)})
        return 0
    rows = [[e.host, e.owner, e.state, e.pid, ago(e.started_at, now), ago(e.last_seen, now),
             "-" if e.tick is None else f"{e.tick} ({ago(e.last_tick_at, now)})",
             len(e.leases), e.version or "-", clip(_loops(e), 60)] for e in engines]
    print_table(("HOST", "ENGINE", "STATE", "PID", "STARTED", "LAST SEEN", "LAST TICK",
                 "LEASES", "VERSION", "LOOPS"), rows,
                "no engine has recorded itself in this log")
    return 0
