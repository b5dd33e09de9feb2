"""An operator's say over one essential process: start, stop, restart, reset of FATAL.

A request is an event (`process-requested`, key `process:<name>`, origin who asked:
`human:cli`, `human:web`) that the survival ledger folds as pending; process_watchdog reads it
at its next tick, decides, and returns what executors do (a StopProcess, a RestartProcess)
with a RequestHandled mark that settles it. Nothing here signals a process: a request only
asks. `check_request` refuses, before anything is written, what supervisorctl refuses: an
unknown name, a reset of a process that is not FATAL, a start of one already running.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from pulse_core import Event, EventDraft, PulseError
from pulse_core.store import EventStore
from pulse_survival.requests import ACTIONS, PROCESS_REQUESTED, Action, ProcessRequest
from pulse_survival.supervised import ProcessState, SupervisedState

REASON_MAX = 500


class UnknownProcess(PulseError, LookupError):
    """A request names no essential process the survival layer supervises."""


class ProcessRequestRefused(PulseError, ValueError):
    """A request that makes no sense in the process's state (reset of one not FATAL, start
    of one running, anything but stop of one pulse cannot start)."""


def _known(states: Sequence[ProcessState]) -> str:
    if not states:
        return ("no essential process is supervised here — add one to config.json's "
                "survival.processes")
    return f"known: {', '.join(s.name for s in states)} (`upulse process list` lists them)"


def check_request(states: Sequence[ProcessState], name: str, action: str,
                  startable: Sequence[str]) -> ProcessState:
    """The state of `name` among `states` when `action` may be asked of it (`startable`:
    the processes with an argv, which pulse can start); UnknownProcess or
    ProcessRequestRefused, naming the process and what to do, when not."""
    if action not in ACTIONS:
        raise ProcessRequestRefused(f"no process action {action!r}: {', '.join(ACTIONS)}")
    found = next((s for s in states if s.name == name), None)
    if found is None:
        raise UnknownProcess(f"no essential process named {name!r}: {_known(states)}")
    state = found.state
    if action == "reset" and state is not SupervisedState.FATAL:
        raise ProcessRequestRefused(
            f"{name} is {state.value}, not FATAL: reset only clears the state the watchdog "
            f"gave up in — `upulse process start {name}` starts a stopped one, `upulse process "
            f"restart {name}` a running one")
    if action in ("start", "restart", "reset") and name not in startable:
        raise ProcessRequestRefused(
            f"{name} has no argv, so pulse cannot start it: give its survival.processes "
            "entry an argv, or start it yourself")
    if action == "start" and state in (SupervisedState.RUNNING, SupervisedState.STARTING):
        pid = f" (pid {found.pid})" if found.pid is not None else ""
        raise ProcessRequestRefused(f"{name} is already {state.value}{pid} — `upulse process "
                                    f"restart {name}` stops and starts it again")
    if action == "stop" and state is SupervisedState.STOPPED:
        raise ProcessRequestRefused(f"{name} is already STOPPED — `upulse process start "
                                    f"{name}` starts it")
    return found


def request_draft(name: str, action: Action, *, origin: str, reason: str = "",
                  host: str = "") -> EventDraft:
    """The `process-requested` event asking `action` of `name`, by `origin` (`cli`, `web`:
    recorded as `human:<origin>`)."""
    if len(reason) > REASON_MAX:
        raise ProcessRequestRefused(f"the reason has {len(reason)} characters: keep it to "
                                    f"{REASON_MAX}")
    request = ProcessRequest(action=action, name=name, reason=reason.strip(), host=host)
    return EventDraft(PROCESS_REQUESTED, f"process:{name}", msgspec.to_builtins(request),
                      origin=f"human:{origin}")


async def request_process(events: EventStore, name: str, action: Action, *, origin: str,
                          reason: str = "", host: str = "") -> Event:
    """Append the request (see `request_draft`); the stored event."""
    draft = request_draft(name, action, origin=origin, reason=reason, host=host)
    return (await events.append([draft])).events[0]
