"""`upulse process list|start|stop|restart|reset|log`: the essential processes the survival
layer supervises, from the shell, as supervisorctl shows and controls them
(docs/survival.md, "Operating the processes").

`list` and `log` read the home (read-only: no daemon needed). `start`, `stop`, `restart` and
`reset` append an operator's `process-requested` event (origin `human:cli`) that the running
daemon's process_watchdog acts on at its next tick, then wait for what it did; as
supervisorctl does when supervisord is down, they refuse, writing nothing, when no daemon
runs: a request left in the log would be acted on whenever an engine next opened the home.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from pulse_cli import config as config_file
from pulse_cli.assembly import BrokenLayer, bound_host, configured_layers
from pulse_cli.home import EXIT_ERROR, EXIT_OK, DaemonStateError, Home
from pulse_cli.instances import process_note
from pulse_cli.output import ago, now_ms, print_json, print_json_line, print_table, printable, span
from pulse_cli.stores import opened
from pulse_core import (
    EffectEntry,
    EffectStatus,
    Essential,
    Event,
    Projector,
    SystemClock,
    UnknownEffect,
    decode_effect,
    decode_mark,
    fold_effect,
)
from pulse_survival import (
    ALIVE_KEY,
    Action,
    ProcessPolicy,
    ProcessState,
    RequestHandled,
    RestartProcess,
    StopProcess,
    SurvivalLedger,
    UnknownProcess,
    check_request,
    follow,
    judged_states,
    log_of,
    request_process,
    survival_layer,
    tail,
    watchdog_in,
)

POLL_S = 0.2


@dataclass(frozen=True)
class Supervision:
    """What the home's survival layer supervises: its processes (config.json's
    survival.processes and the configured layers' essentials), its policy, and the host its
    ledger folds."""

    processes: tuple[Essential, ...]
    policy: ProcessPolicy
    host: str

    @property
    def startable(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.processes if p.argv)

    def spec(self, name: str) -> Essential:
        found = next((p for p in self.processes if p.name == name), None)
        if found is None:
            known = ", ".join(p.name for p in self.processes) or "none is configured"
            raise UnknownProcess(f"no essential process named {name!r}: known: {known} "
                                 "(`upulse process list` lists them)")
        return found


def supervision(home: Home) -> Supervision:
    """The home's survival layer as its daemon builds it (without the essentials of a
    configured layer that cannot be built here, which a warning names)."""
    cfg = config_file.load_or_default(home.readable().config)
    try:
        layers = configured_layers(home.root, cfg, clock=SystemClock())
    except BrokenLayer as exc:  # survival.processes are still known
        print(f"upulse: warning: {printable(str(exc))} — the essential processes of the "
              "configured layers are not listed", file=sys.stderr)
        layers = []
    host = bound_host(home.root, cfg)
    layer = survival_layer(cfg.survival, home.root, host=host,
                           essentials=tuple(e for la in layers for e in la.essentials))
    watchdog = watchdog_in(layer)
    assert watchdog is not None  # the survival layer always has one
    return Supervision(watchdog.processes, watchdog.policy, host)


async def states(home: Home, seen: Supervision) -> list[ProcessState]:
    """Each supervised process as of now, from the log's survival ledger and the newest
    process-alive sample."""
    async with opened(home.readable(), read_only=True) as stores:
        ledger = SurvivalLedger(seen.host)
        folded: dict[str, Any] = await Projector(stores.events, [ledger]).catch_up()
        sample = (await stores.vitals.latest([ALIVE_KEY])).get(ALIVE_KEY)
    return judged_states(folded.get(ledger.name), sample, seen.processes, seen.policy,
                         now_ms())


async def list_processes(home: Home, *, as_json: bool) -> int:
    """Print each supervised process as supervisorctl shows it."""
    seen = supervision(home)
    found = await states(home, seen)
    running = home.running_pid() is not None
    if as_json:
        print_json({"daemon_running": running, "processes": found})
        return EXIT_OK
    now = now_ms()
    print_table(("NAME", "STATE", "PID", "UPTIME", "RESTARTS/1h", "NOTE"), [
        [p.name, p.state.value, p.pid or "-", "-" if p.uptime_s is None else span(p.uptime_s),
         p.restarts_last_hour, process_note(p, now)] for p in found],
        "no essential processes: list them in config.json's survival.processes")
    sampled = max((p.sampled_at or 0 for p in found), default=0)
    if found and not running:
        when = f"as last sampled, {ago(sampled, now)}" if sampled else "never sampled"
        print(f"\nno daemon runs in {home.root}: states {when}; nothing supervises them now")
    return EXIT_OK


async def control(home: Home, *, name: str, action: Action, reason: str, wait_s: float,
                  as_json: bool) -> int:
    """Ask the running daemon to `action` process `name`, then wait (`wait_s`, 0: not at
    all) for what it did."""
    seen = supervision(home)
    before = check_request(await states(home, seen), name, action, seen.startable)
    pid = home.running_pid()
    if pid is None:
        raise DaemonStateError(f"no daemon is running in {home.root}, so nothing would "
                               f"{action} {name}: start it (`upulse daemon start`) — its "
                               "survival layer then supervises every essential process")
    async with opened(home, read_only=False) as stores:
        asked = await request_process(stores.events, name, action, origin="cli",
                                      reason=reason, host=seen.host)
        outcome = await _outcome(stores.events, asked, wait_s) if wait_s > 0 else None
    if as_json:
        print_json({"request": asked, "was": before.state.value, "outcome": outcome})
    else:
        print(printable(_said(name, action, asked, outcome=outcome, pid=pid, wait_s=wait_s)))
    failed = outcome is not None and outcome.get("status") == str(EffectStatus.FAILED)
    return EXIT_ERROR if failed else EXIT_OK


async def _outcome(events: Any, asked: Event, wait_s: float) -> dict[str, Any] | None:
    """What the daemon did about request `asked`: `handled` (the watchdog acted on it), and
    the effect it gave with its `status`, `result` and `error` once finished; None when it
    was not acted on within `wait_s`."""
    deadline = time.monotonic() + wait_s
    seen, handled, effect = asked.seq, False, None
    entry: EffectEntry | None = None
    while time.monotonic() < deadline:
        for event in await events.read(seen):
            seen = event.seq
            mark = decode_mark(event)
            if isinstance(mark, RequestHandled) and mark.request == asked.seq:
                handled = True
            elif event.kind == "effect" and entry is None:
                decoded = _ours(event)
                if decoded is not None and decoded.request == asked.seq:
                    entry, effect = fold_effect(None, event), decoded.tag()
            elif entry is not None and event.key == entry.id:
                entry = fold_effect(entry, event) or entry
        # the mark and its effect are appended together: handled without one is a reset
        if handled and (entry is None or entry.finished):
            return {"handled": True, "effect": effect,
                    **({} if entry is None else {"status": str(entry.status),
                                                 "result": entry.result, "error": entry.error})}
        await asyncio.sleep(POLL_S)
    return None


def _ours(event: Event) -> RestartProcess | StopProcess | None:
    """The restart or stop an `effect` event holds, if it is one."""
    body = event.data.get("effect") if isinstance(event.data, dict) else None
    if not isinstance(body, dict) or body.get("type") not in (RestartProcess.tag(),
                                                               StopProcess.tag()):
        return None
    try:
        decoded = decode_effect(event.data)
    except (UnknownEffect, msgspec.ValidationError):
        return None
    return decoded if isinstance(decoded, RestartProcess | StopProcess) else None


def _said(name: str, action: str, asked: Event, *, outcome: dict[str, Any] | None, pid: int,
          wait_s: float) -> str:
    """The line that says what happened to the request."""
    if outcome is None:
        waited = "" if wait_s <= 0 else f" and not acted on within {wait_s:g} s"
        return (f"{action} {name}: asked (event #{asked.seq}){waited} — the daemon (pid {pid}) "
                "acts on it at its next tick; `upulse process list` shows when it has")
    result = outcome.get("result") or {}
    if outcome.get("status") == str(EffectStatus.FAILED):
        return f"{action} {name} failed: {outcome.get('error')}"
    if outcome.get("effect") is None and action != "reset":
        return (f"{action} {name}: acted on (event #{asked.seq}), with nothing to do: the "
                f"survival layer had the same under way — `upulse process list` shows {name}")
    if action == "reset":
        return (f"{name} reset (event #{asked.seq}): supervised again, failed starts and the "
                "hourly budget counted afresh; the watchdog starts it if it is down")
    if action == "stop":
        how = "was not running" if result.get("pid") is None else \
            f"stopped (pid {result['pid']}, {result.get('signal')})"
        return f"{name} {how}; it stays stopped until `upulse process start {name}`"
    if result.get("adopted"):
        return f"{name} was already running (pid {result.get('pid')}): adopted"
    stopped = f"pid {result['stopped']} stopped ({result.get('signal')}), " \
        if result.get("stopped") else ""
    return f"{name} {action}ed: {stopped}pid {result.get('pid')} started"


def log(home: Home, *, name: str, lines: int, follow_on: bool, as_json: bool) -> int:
    """Print the last `lines` lines of process `name`'s output log; with `follow_on`, then
    each new line as it is written (until Ctrl-C)."""
    path = log_of(supervision(home).spec(name), home.layout.logs)
    last = tail(path, lines)
    if as_json and not follow_on:
        print_json(last)
        return EXIT_OK
    for line in last:
        _show(line, as_json)
    if not follow_on:
        return EXIT_OK
    for line in follow(path):
        _show(line, as_json)
    return EXIT_OK


def _show(line: str, as_json: bool) -> None:
    if as_json:
        print_json_line(line)
    else:
        print(printable(line), flush=True)
