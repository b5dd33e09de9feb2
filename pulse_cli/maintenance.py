"""`upulse maintenance report|history|health|run`: the maintenance layer's cycles from the
shell (docs/maintenance.md, "From the shell").

`report`, `history` and `health` open the home read-only (they never write and never wait
for a running daemon) and fold the cycles as the layer's web page does (MaintenanceCycles).
`run` appends a `maintenance-requested` event, the on-demand request the layer's rule
honours at its next tick; it refuses, writing nothing, when no daemon runs the layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from pulse_adapters.maintenance import (
    CycleReport,
    HealthSignal,
    MaintenanceCycles,
    cycle_history,
    load_settings,
    request_cycle,
)
from pulse_cli import config as config_file
from pulse_cli.home import EXIT_OK, EXIT_STATE, CliError, DaemonStateError, Home
from pulse_cli.output import ago, clip, now_ms, print_json, print_table, printable, span
from pulse_cli.stores import opened
from pulse_core import Projector
from pulse_core.maintenance import read_activity

HISTORY_LIMIT = 20
"""The cycles `history` lists by default (at most MaintenanceCycles keeps: 50)."""
CYCLE_CLASS = "maintenance_cycle"

_HISTORY_HEADERS = ("CYCLE", "TRIGGER", "BEGAN", "STATUS", "TOOK", "OUTCOME", "CHANGES",
                    "HEALTH")
_NO_CYCLE = ("no maintenance cycle has ended in this home yet — with the `maintenance` layer "
             "in config.json's layers, the daemon runs one on its schedule, and `upulse "
             "maintenance run` asks for one now")


def import_origins(cfg: config_file.Config) -> tuple[str, ...]:
    """The writers whose memory came from outside in the home `cfg` configures: its
    maintenance layer's `imports.origins` (pulse's defaults without the layer).
    MaintenanceSettingsError names a field of the layer's settings that is wrong."""
    return load_settings(cfg.layers.get("maintenance")).imports.origins


def took(ms: int | None) -> str:
    """A cycle's duration: `0.4s` under a minute, else as `span` says it; `-` while running."""
    if ms is None:
        return "-"
    return f"{ms / 1000:.1f}s" if ms < 60_000 else span(ms / 1000)


def changed(changes: dict[str, int] | None) -> str:
    """`decayed 5, overdue_surfaced 1`, or `-` for no change."""
    return ", ".join(f"{name} {count}" for name, count in sorted((changes or {}).items())
                     if count) or "-"


async def _cycles(home: Home) -> list[dict[str, Any]]:
    """Every cycle MaintenanceCycles keeps, newest first, as its page lists them."""
    projection = MaintenanceCycles()
    async with opened(home.readable(), read_only=True) as stores:
        states: dict[str, Any] = await Projector(stores.events, [projection]).catch_up()
    return cycle_history(states[projection.name])


async def _last_report(home: Home, cycle: str | None) -> CycleReport:
    """The report of cycle `cycle` (None: the newest ended cycle); CliError when there is
    none, naming what to do."""
    if cycle is not None:
        async with opened(home.readable(), read_only=True) as stores:
            activity = await read_activity(stores.events, cycle)
        if activity is None or activity.activity_class != CYCLE_CLASS:
            raise CliError(f"no maintenance cycle {cycle!r} in this home — `upulse "
                           "maintenance history` lists the cycles")
        if activity.status == "running" or not isinstance(activity.report, dict):
            raise CliError(f"maintenance cycle {cycle!r} is {activity.status} and has no "
                           "report" + (" yet" if activity.status == "running" else ""))
        return _decoded(cycle, activity.report)
    ended = [row for row in await _cycles(home) if row["report"] is not None]
    if not ended:
        raise CliError(_NO_CYCLE)
    return _decoded(ended[0]["cycle"], ended[0]["report"])


def _decoded(cycle: str, report: dict[str, Any]) -> CycleReport:
    try:
        return msgspec.convert(report, CycleReport)
    except msgspec.ValidationError as exc:
        raise CliError(f"the report of maintenance cycle {cycle!r} is not a cycle report "
                       f"({exc}) — `upulse events --key activity:{cycle}` shows it as "
                       "stored") from None


async def report(home: Home, *, cycle: str | None, as_json: bool) -> int:
    """Print a cycle's report (the newest ended cycle's, or `cycle`'s)."""
    found = await _last_report(home, cycle)
    if as_json:
        print_json(found)
        return EXIT_OK
    print(_report_text(found, now_ms()))
    return EXIT_OK


def _listed(values: Sequence[str]) -> str:
    return ", ".join(clip(v, 60) for v in values) if values else "none"


def _report_text(r: CycleReport, now: int) -> str:
    held = sum(s.healthy for s in r.health)
    lines = [
        f"cycle {printable(r.cycle)} ({printable(r.trigger)}): {r.status}, ended "
        f"{ago(r.ended_at, now)} after {took(r.ended_at - r.cycle_start)} — "
        f"{printable(r.outcome)}",
        f"  reviewed {r.reviewed} elements; wrote {r.writes} events in {r.transactions} "
        "appends",
        f"  changes: {changed(r.changes)}",
        f"  deferred: {_listed(r.deferred)}",
        f"  needed authority: {_listed(r.needed_authority)}",
        f"  warnings: {_listed(r.warnings)}",
        f"  overdue: {_listed(r.overdue)}",
        f"  contested: {_listed(r.contested)}",
        f"  health: {held} of {len(r.health)} signals hold"
        + ("" if r.healthy else " (`upulse maintenance health` lists them)"),
    ]
    return "\n".join(lines)


async def history(home: Home, *, limit: int, as_json: bool) -> int:
    """Print the newest `limit` cycles, newest first: when, trigger, status, duration,
    outcome, changes, and whether its health signals held."""
    rows = (await _cycles(home))[:limit]
    if as_json:
        print_json([{k: v for k, v in row.items() if k != "report"} for row in rows])
        return EXIT_OK
    now = now_ms()
    print_table(_HISTORY_HEADERS, [
        [clip(row["cycle"], 40), row["trigger"], ago(row["began_at"], now), row["status"],
         took(row["took_ms"]), clip(row["outcome"] or "-", 40),
         clip(changed(row["changes"]), 50),
         "-" if row["healthy"] is None else ("ok" if row["healthy"] else "UNHEALTHY")]
        for row in rows], _NO_CYCLE.replace("has ended", "has begun"))
    return EXIT_OK


async def health(home: Home, *, as_json: bool) -> int:
    """Print the health signals of the newest ended cycle's report; exits 3 (EXIT_STATE)
    when one does not hold, so a monitor can run it."""
    found = await _last_report(home, None)
    if as_json:
        print_json({"cycle": found.cycle, "ended_at": found.ended_at, "healthy": found.healthy,
                    "signals": found.health})
    else:
        print(f"health after cycle {printable(found.cycle)}, ended {ago(found.ended_at)}:")
        print_table(("SIGNAL", "VALUE", "HEALTHY WHEN", "STATE"),
                    [_signal_row(s) for s in found.health], "  no signals in this report")
    return EXIT_OK if found.healthy else EXIT_STATE


def _signal_row(s: HealthSignal) -> list[Any]:
    return [s.name, s.value, s.healthy_when, "ok" if s.healthy else f"NOT OK: {s.if_exceeded}"]


async def run(home: Home, *, reason: str, as_json: bool) -> int:
    """Ask the running daemon's maintenance layer for a cycle now (a `maintenance-requested`
    event); DaemonStateError, with nothing written, when no daemon runs or its config.json
    does not name the layer."""
    cfg = config_file.load_or_default(home.readable().config)
    if "maintenance" not in cfg.layers:
        raise CliError(f"config.json in {home.root} does not name the `maintenance` layer, so "
                       "no daemon of this home runs cycles — add \"maintenance\": {} to its "
                       "layers and restart the daemon (`upulse daemon restart`)")
    if not load_settings(cfg.layers["maintenance"]).triggers.on_demand:
        raise CliError("the maintenance layer's triggers.on_demand is false in config.json: "
                       "it ignores requests — set it to true and restart the daemon")
    pid = home.running_pid()
    if pid is None:
        raise DaemonStateError(f"no daemon is running in {home.root}: nothing would run the "
                               "cycle — start one (`upulse daemon start`), which runs a "
                               "cycle on its schedule or on this request")
    async with opened(home, read_only=False) as stores:
        event = await request_cycle(stores.events, reason, origin="cli")
    if as_json:
        print_json(event)
    else:
        print(f"cycle requested (event #{event.seq}); the daemon (pid {pid}) begins it at "
              "its next tick unless one is running — `upulse maintenance history` shows it")
    return EXIT_OK
