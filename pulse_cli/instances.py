"""`upulse init`, `upulse instances` and `upulse daemon status`: homes and what runs in them."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from pulse_cli import config as config_file
from pulse_cli.home import DaemonStateError, DaemonStatus, Home, list_homes
from pulse_cli.output import ago, clip, now_ms, print_json, print_table, printable, span
from pulse_cli.queries import read_effects
from pulse_cli.stores import log_file
from pulse_core import Event, EventStore, open_home
from pulse_core._homelock import private_folder

ERRORS_SHOWN = 3
ERROR_LOOKBACK = 100_000  # events searched back from the head for the last errors


async def initialise(home: Home, instance: str, *, as_json: bool = False) -> int:
    """Lay out `home` (config, stores, objects/, engine directory); what exists is kept as is.
    Prints what was created (with `as_json`: the home, the instance and the created names)."""
    from pulse_cli.enginedir import init_engine_dir  # git and the template: only for init

    created: list[str] = []
    private_folder(home.root)
    if not home.config.exists():
        config_file.write_default(home.config, instance)
        created.append(home.config.name)
    cfg = config_file.load(home.config)
    layout = home.layout
    stores = {log_file(home, cfg): "", layout.vitals_db: "", layout.side_db: "",
              layout.objects: "/", layout.checkpoints: "/", layout.logs: "/"}
    missing = [f"{path.name}{slash}" for path, slash in stores.items() if not path.exists()]
    if missing:  # open_home creates what is missing and leaves what exists as it is
        await (await open_home(home.root, store=cfg.store)).close()
        created += missing
    engine_dir = await asyncio.to_thread(init_engine_dir, home.root)
    if engine_dir:
        created += ["engine/", "staging/"]
    if as_json:
        print_json({"home": str(home.root), "instance": cfg.instance, "created": created})
    elif created:
        shown = [*created[:-2], "engine/ (git, branch main) and staging/ (worktree, branch "
                 "staging)"] if engine_dir else created
        print(printable(f"initialised {home.root}: created {', '.join(shown)}"))
    else:
        print(printable(f"{home.root} already exists; nothing changed"))
    return 0


def _state(home: Home) -> tuple[str, int | None]:
    if not home.initialised:
        return "not initialised", None
    pid = home.running_pid()
    return ("running", pid) if pid is not None else ("stopped", None)


def instances(base: Home, *, as_json: bool) -> int:
    """List the base home and every named instance under it with its daemon's status."""
    listed: list[dict[str, Any]] = []
    for name, home in list_homes(base.root):
        if name != "default" and not home.root.exists():
            continue
        state, pid = _state(home)
        listed.append({"name": name, "home": str(home.root), "state": state, "pid": pid})
    if as_json:
        print_json(listed)
        return 0
    rows = [[i["name"], i["state"] + (f" (pid {i['pid']})" if i["pid"] else ""), i["home"]]
            for i in listed]
    print_table(("INSTANCE", "STATUS", "HOME"), rows, "no instances")
    return 0


async def _last_errors(store: EventStore) -> list[Event]:
    after = max(await store.last_seq() - ERROR_LOOKBACK, 0)
    return (await store.read(after, kinds=["error"]))[-ERRORS_SHOWN:]


def _tick_rate(status: DaemonStatus, now: int) -> float:
    minutes = max(now - status.started_at, 1) / 60_000
    return status.ticks / minutes


async def _from_log(home: Home, store: str | None) -> tuple[int, list[Event]]:
    """How many effects are unfinished, and the last errors, in the log at `store`."""
    stores = await open_home(home.root, store=store, read_only=True)
    try:
        pending = [e for e in (await read_effects(stores.events)).values() if not e.finished]
        return len(pending), await _last_errors(stores.events)
    finally:
        await stores.close()


async def status(home: Home, *, as_json: bool) -> int:
    """Show the daemon's pid, uptime, revision, ticks, pending effects and last errors.

    Works on any home with an event log (without config.json: an embedded engine's), and
    whatever config.json says: when it cannot be read, the report says why, and the log is
    read at the store the daemon reported (skipped when there is none).
    Exits 3 (with what is known of the last run) when the daemon is not running.
    """
    home.readable()
    pid = home.running_pid()
    last = home.daemon_status()
    cfg: config_file.Config | None = None
    problem: str | None = None
    try:
        cfg = config_file.load_or_default(home.config)
    except config_file.ConfigError as exc:
        problem = str(exc)
    pending: int | None = None
    errors: list[Event] = []
    store = cfg.store if cfg is not None else (last.store if last is not None else None)
    if cfg is not None or store is not None:
        pending, errors = await _from_log(home, store)
    instance = cfg.instance if home.initialised and cfg is not None else (
        last.instance if last is not None else home.root.name)
    now = now_ms()
    report: dict[str, Any] = {
        "instance": instance, "home": str(home.root), "running": pid is not None,
        "pid": pid, "status": None if last is None else msgspec.to_builtins(last),
        "uptime_s": None, "tick_rate_per_min": None, "config_error": problem,
        "pending_effects": pending, "last_errors": [msgspec.to_builtins(e) for e in errors],
    }
    if pid is not None and last is not None and last.pid == pid:
        report["uptime_s"] = (now - last.started_at) / 1000
        report["tick_rate_per_min"] = round(_tick_rate(last, now), 2)
    if as_json:
        print_json(report)
    else:
        _print_status(report, last, now)
    if pid is None:
        raise DaemonStateError(f"the daemon of {home.root} is not running")
    return 0


def _print_status(report: dict[str, Any], last: DaemonStatus | None, now: int) -> None:
    lines = [("instance", report["instance"]), ("home", report["home"])]
    if report["running"]:
        lines.append(("state", f"running (pid {report['pid']})"))
    else:
        stopped = ago(last.stopped_at, now) if last and last.stopped_at else "-"
        lines.append(("state", f"stopped (last stop {stopped})"))
    if last is not None:
        lines.append(("revision", last.revision or "none (no engine directory code)"))
        if last.uncommitted:
            shown = ", ".join(last.uncommitted[:5]) + (", …" if len(last.uncommitted) > 5 else "")
            lines.append(("not running", f"{len(last.uncommitted)} uncommitted change(s) in "
                                         f"engine/ ({shown}): promote them through staging"))
    if report["uptime_s"] is not None and last is not None:
        lines.append(("uptime", span(report["uptime_s"])))
        lines.append(("ticks", f"{last.ticks} ({report['tick_rate_per_min']:g}/min), last "
                               f"{ago(last.last_tick_at, now)}, next in "
                               f"{last.tick_ms if last.tick_ms is not None else '-'} ms"))
        if last.reloads:
            lines.append(("reloads", f"{last.reloads}, last {ago(last.last_reload_at, now)}"))
    if report["config_error"] is not None:
        lines.append(("config", f"cannot be read: {report['config_error']}"))
    unknown = report["pending_effects"] is None
    lines.append(("pending", "unknown (no log to read)" if unknown else
                  f"{report['pending_effects']} effects"))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(printable(f"{key.ljust(width)}  {value}"))
    errors = report["last_errors"]
    none = "unknown" if unknown else "none"
    print(f"{'errors'.ljust(width)}  {none if not errors else ''}".rstrip())
    for error in errors:
        data = error["data"] if isinstance(error["data"], dict) else {}
        message = f"{data.get('type', '')}: {data.get('message', '')}"
        print(printable(f"  #{error['seq']}  {ago(error['ts'], now)}  {error['key']}  "
                        f"{clip(message, 80)}"))
