"""`upulse init`, `upulse instances` and `upulse daemon status`: homes and what runs in them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from pulse_adapters.web import served_address
from pulse_cli import config as config_file
from pulse_cli.home import (
    DaemonStateError,
    DaemonStatus,
    Home,
    list_homes,
)
from pulse_cli.output import (
    ago,
    clip,
    now_ms,
    print_json,
    print_table,
    printable,
    span,
    table,
)
from pulse_cli.queries import read_effects
from pulse_cli.stores import (
    LogUnavailable,
    open_stores,
    shown,
)
from pulse_core import (
    Event,
    EventStore,
    LoopState,
)
from pulse_survival import ProcessState, SupervisedState

ERRORS_SHOWN = 3
ERROR_LOOKBACK = 100_000  # events searched back from the head for the last errors


def _state(home: Home) -> tuple[str, int | None]:
    if not home.initialised and not home.layout.events_db.is_file():
        return "not initialised", None
    pid = home.running_pid()
    if pid is not None:
        return "running", pid
    engine = home.engine_pid()
    if engine is not None:
        return "embedded engine", engine
    last = home.daemon_status()
    if _died(last):
        return "died", last.pid if last is not None else None
    return ("stopped" if home.initialised else "not initialised"), None


def _died(last: DaemonStatus | None) -> bool:
    """Whether the daemon's last status says it was running when its process went away
    (killed, or the machine lost power): it never wrote that it stopped. Only asked while
    its pid is not running."""
    return last is not None and last.state != "stopped" and last.stopped_at is None


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
    stores = await open_stores(home, store, read_only=True)
    try:
        pending = [e for e in (await read_effects(stores.events)).values() if not e.finished]
        return len(pending), await _last_errors(stores.events)
    finally:
        await stores.close()


async def status(home: Home, *, as_json: bool) -> int:
    """Show the daemon's pid, uptime, revision, ticks and the time to the next, pending
    effects and last errors (never "none" while restarts or give-ups happened in the last
    hour), then its essential processes as supervisorctl shows them, its engine loops that
    are not running and the last notices (docs/cli.md, `upulse daemon status`).

    Works on any home with an event log (without config.json: an embedded engine's), and
    whatever config.json says: when it cannot be read, the report says why, and the log is
    read at the store the daemon reported (skipped when there is none). A log that cannot
    be opened (its database server down) is reported too, and the command fails with
    LogUnavailable after the report.
    Exits 3 (with what is known of the last run) when the daemon is not running.
    """
    home.readable()
    pid = home.running_pid()
    last = home.daemon_status()
    engine = None if pid is not None else home.engine_pid()
    cfg: config_file.Config | None = None
    problem: str | None = None
    try:
        cfg = config_file.load_or_default(home.config)
    except config_file.ConfigError as exc:
        problem = str(exc)
    pending: int | None = None
    errors: list[Event] = []
    store = cfg.store if cfg is not None else (last.store if last is not None else None)
    log_error: LogUnavailable | None = None
    if cfg is not None or store is not None:
        try:
            pending, errors = await _from_log(home, store)
        except LogUnavailable as exc:
            log_error = exc
    instance = cfg.instance if home.initialised and cfg is not None else (
        last.instance if last is not None else home.root.name)
    now = now_ms()
    report: dict[str, Any] = {
        "instance": instance, "home": str(home.root), "running": pid is not None,
        "pid": pid, "status": None if last is None else _status_shown(last),
        "embedded_engine_pid": engine, "died": pid is None and _died(last),
        "store": None if store is None else shown(store),
        "uptime_s": None, "tick_rate_per_min": None, "config_error": problem,
        "log_error": None if log_error is None else str(log_error),
        "pending_effects": pending, "last_errors": [msgspec.to_builtins(e) for e in errors],
    }
    running = pid is not None and last is not None and last.pid == pid
    if running and last is not None:
        report["uptime_s"] = (now - last.started_at) / 1000
        report["tick_rate_per_min"] = round(_tick_rate(last, now), 2)
    processes = _processes(last)
    report["processes"] = [msgspec.to_builtins(p) for p in processes]
    report["next_tick_in_s"] = (None if not running or last is None or last.next_tick_at is None
                                else round((last.next_tick_at - now) / 1000, 1))
    report["trouble"] = _trouble(processes, last)
    report["web_ui"] = served_address(home.root) if running else None
    if as_json:
        print_json(report)
    else:
        _print_status(report, last, now)
        _print_supervised(processes, last, now, running=running)
    if pid is None:
        unread = "" if log_error is None else f" (and its log cannot be read: {log_error})"
        raise DaemonStateError(f"the daemon of {home.root} is not running"
                               f"{_why_not_running(report, last)}{unread}")
    if log_error is not None:
        raise log_error
    return 0


def _why_not_running(report: dict[str, Any], last: DaemonStatus | None) -> str:
    """What is known beyond "not running": an embedded engine holds the home, or the daemon
    died without stopping."""
    if report["embedded_engine_pid"] is not None:
        return (f"; an embedded engine (pid {report['embedded_engine_pid']}) holds the home, "
                "so no daemon can start here until it closes")
    if report["died"] and last is not None:
        return f"; it (pid {last.pid}) died without stopping"
    return ""


def _state_line(report: dict[str, Any], last: DaemonStatus | None, now: int) -> str:
    """The `state` line: running, held by an embedded engine, died, or stopped."""
    if report["running"]:
        return f"running (pid {report['pid']})"
    if report["embedded_engine_pid"] is not None:
        return (f"no daemon: an embedded engine (pid {report['embedded_engine_pid']}) "
                "runs in this home")
    if report["died"] and last is not None:
        return (f"not running: the daemon (pid {last.pid}) died without stopping — its last "
                f"status at {_clock_time(last.updated_at)} ({ago(last.updated_at, now)})")
    if last is None:
        return "stopped (no daemon has run here)"
    stopped = ago(last.stopped_at, now) if last.stopped_at else "at an unknown time"
    return f"stopped (last stop {stopped})"


def _clock_time(ms: int) -> str:
    """`ms` as the local date and time, to the second."""
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def _status_shown(last: DaemonStatus) -> dict[str, Any]:
    """daemon.status.json as status prints it: the store URL without its password."""
    shown_status: dict[str, Any] = msgspec.to_builtins(last)
    if last.store is not None:
        shown_status["store"] = shown(last.store)
    return shown_status


def _print_status(report: dict[str, Any], last: DaemonStatus | None, now: int) -> None:
    lines = [("instance", report["instance"]), ("home", report["home"])]
    lines.append(("state", _state_line(report, last, now)))
    if last is not None:
        lines.append(("revision", last.revision or "none (no engine directory code)"))
        if last.uncommitted:
            shown = ", ".join(last.uncommitted[:5]) + (", …" if len(last.uncommitted) > 5 else "")
            lines.append(("not running", f"{len(last.uncommitted)} uncommitted change(s) in "
                                         f"engine/ ({shown}): promote them through staging"))
    if report["uptime_s"] is not None and last is not None:
        lines.append(("uptime", span(report["uptime_s"])))
        left = report["next_tick_in_s"]
        due = "next tick not yet due" if left is None else \
            "next tick due now" if left <= 0 else f"next tick in {left:g} s"
        lines.append(("ticks", f"{last.ticks} ({report['tick_rate_per_min']:g}/min), last "
                               f"{ago(last.last_tick_at, now)}, {due}"))
        if last.reloads:
            lines.append(("reloads", f"{last.reloads}, last {ago(last.last_reload_at, now)}"))
    if report["config_error"] is not None:
        lines.append(("config", f"cannot be read: {report['config_error']}"))
    if report["store"] is not None:
        lines.append(("log", report["store"]))
    if report["web_ui"] is not None:
        lines.append(("web UI", f"{report['web_ui']} (`upulse ui` prints the token)"))
    if report["log_error"] is not None:
        lines.append(("log", f"cannot be read: {report['log_error']}"))
    unknown = report["pending_effects"] is None
    lines.append(("pending", "unknown (no log to read)" if unknown else
                  f"{report['pending_effects']} effects"))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(printable(f"{key.ljust(width)}  {value}"))
    errors = report["last_errors"]
    none = "unknown" if unknown else "none"
    if report["trouble"]:  # restarts and give-ups are no `error` events, yet never "none"
        none = f"no error events, but {'; '.join(report['trouble'])}"
    print(printable(f"{'errors'.ljust(width)}  {none if not errors else ''}".rstrip()))
    for error in errors:
        data = error["data"] if isinstance(error["data"], dict) else {}
        message = f"{data.get('type', '')}: {data.get('message', '')}"
        print(printable(f"  #{error['seq']}  {ago(error['ts'], now)}  {error['key']}  "
                        f"{clip(message, 80)}"))


def _processes(last: DaemonStatus | None) -> list[ProcessState]:
    """The essential processes the daemon last reported ([] for none, or an older file)."""
    try:
        return msgspec.convert(last.processes if last is not None else [], list[ProcessState])
    except msgspec.ValidationError:
        return []


def _trouble(processes: list[ProcessState], last: DaemonStatus | None) -> list[str]:
    """The restarts and give-ups of the last report, in words: what makes "errors none" a
    lie even when no `error` event was recorded."""
    said: list[str] = []
    for process in processes:
        restarts = f"{process.restarts_last_hour} restart(s) in the last hour"
        if process.state is SupervisedState.FATAL:
            said.append(f"{process.name} given up after {restarts}: {process.given_up_why}")
        elif process.restarts_last_hour:
            said.append(f"{process.name}: {restarts}")
    for loop in last.loops if last is not None else []:
        if loop.restarts:
            said.append(f"engine loop {loop.name}: {loop.restarts} restart(s)")
    return said


def process_note(process: ProcessState, now: int) -> str:
    """What supervisorctl would say beside a process's state."""
    if process.pending is not None:
        return f"{process.pending} asked by {process.asked_by or 'an operator'}"
    if process.state is SupervisedState.STOPPED:
        return "stopped by an operator; `upulse process start` starts it"
    if process.state is SupervisedState.FATAL:
        return f"gave up: {process.given_up_why}"
    if process.state is SupervisedState.BACKOFF:
        return "restart due" if process.next_restart_at is None else \
            f"restart {ago(process.next_restart_at, now)}"
    if process.state is SupervisedState.STARTING and process.last_restart_at is not None:
        return f"restarted {ago(process.last_restart_at, now)}"
    if process.state is SupervisedState.EXITED:
        return "not running; no argv to restart it with"
    if process.state is SupervisedState.UNKNOWN:
        return "not sampled yet"
    return ""


def _print_supervised(processes: list[ProcessState], last: DaemonStatus | None, now: int,
                      *, running: bool) -> None:
    """The essential processes as supervisorctl shows them, the engine's loops that are not
    running (while the daemon runs), and the last notices."""
    if last is None:
        return
    if processes:
        print("\nessential processes" + ("" if running else " (as the last run left them)"))
        print(table(("NAME", "STATE", "PID", "UPTIME", "RESTARTS/1h", "NOTE"), [
            [p.name, p.state.value, p.pid or "-",
             "-" if p.uptime_s is None else span(p.uptime_s), p.restarts_last_hour,
             process_note(p, now)] for p in processes]))
    # a loop whose body returned (EXITED) ended by design, as a one-shot check does
    stuck = [loop for loop in last.loops
             if loop.state not in (LoopState.RUNNING, LoopState.EXITED)]
    if running and stuck:
        print("\nengine loops not running")
        print(table(("LOOP", "STATE", "RESTARTS", "LAST ERROR"), [
            [loop.name, loop.state.value.upper(), loop.restarts, clip(loop.last_error or "", 100)]
            for loop in stuck]))
    if last.notices:
        print(f"\nlast {len(last.notices)} notice(s)")
        print(table(("WHEN", "TOPIC", "LEVEL", "TEXT"), [
            [ago(n.ts, now), n.topic, n.level, clip(n.text, 100)]
            for n in reversed(last.notices)]))
