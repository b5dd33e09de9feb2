"""The survival layer in the web UI: its page, each essential process as supervisorctl shows
it (RUNNING, STARTING, BACKOFF, FATAL, STOPPED), judged in the UI's process from the survival
ledger it folds and the newest `process-alive` sample, with the watchdog's own settings, the
end of a process's output log (`?log=NAME&lines=N`), and the operator's start, stop, restart
and reset (each a `process-requested` event the watchdog acts on); and its metrics, the
restarts and give-ups of each process since the log began (ProcessTally)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from pulse_core import (
    Essential,
    Event,
    HomeLayout,
    LayerMetric,
    PageAction,
    PageRequest,
    Projection,
    UiPage,
    UnknownEffect,
    VitalReading,
    decode_effect,
    decode_mark,
)
from pulse_survival.config import ProcessPolicy
from pulse_survival.control import ProcessRequestRefused, check_request, request_draft
from pulse_survival.effects import RestartProcess
from pulse_survival.ledger import SurvivalLedger
from pulse_survival.logtail import log_of, tail
from pulse_survival.marks import GaveUp
from pulse_survival.requests import ACTIONS, Action
from pulse_survival.supervised import ALIVE_KEY, ProcessState, supervised_states

TAIL_LINES = 50
"""The lines the log view shows unless asked for more."""


def survival_page(processes: Sequence[Essential], policy: ProcessPolicy,
                  ledger: SurvivalLedger) -> UiPage:
    """The Processes page of the survival layer that keeps `processes` alive under
    `policy`, reading `ledger`."""
    startable = tuple(spec.name for spec in processes if spec.argv)

    async def states(request: PageRequest) -> list[ProcessState]:
        latest = (await request.vitals.latest([ALIVE_KEY])).get(ALIVE_KEY)
        vitals = {} if latest is None else {
            ALIVE_KEY: VitalReading(latest, max(request.now - latest.ts, 0))}
        snapshot = msgspec.structs.replace(request.snapshot, vitals=vitals, at=request.now)
        return supervised_states(snapshot, processes, policy)

    async def view(request: PageRequest) -> dict[str, Any]:
        if "log" in request.query:
            return _log_view(processes, request)
        return {"now": request.now, "startable": startable,
                "processes": msgspec.to_builtins(await states(request))}

    def control(action: Action) -> PageAction:
        async def act(request: PageRequest, body: Any) -> dict[str, Any]:
            name = body.get("name") if isinstance(body, dict) else None
            if not isinstance(name, str) or request.append is None:
                raise ProcessRequestRefused(f'send {{"name": "<process>"}} to {action} it')
            before = check_request(await states(request), name, action, startable)
            draft = request_draft(name, action, origin=request.origin, host=ledger.host,
                                  reason=str(body.get("reason") or f"{action} from the UI"))
            (event,) = await request.append([draft])
            return {"name": name, "action": action, "seq": event.seq,
                    "was": before.state.value, "origin": event.origin}
        return act

    return UiPage("processes", "Processes", view, projections=(ledger,),
                  assets="pulse_survival:ui", actions={a: control(a) for a in ACTIONS})


def _log_view(processes: Sequence[Essential], request: PageRequest) -> dict[str, Any]:
    """The end of one process's output log: `?log=NAME&lines=N` (default TAIL_LINES)."""
    name = request.query["log"]
    spec = next((p for p in processes if p.name == name), None)
    if spec is None:
        known = ", ".join(p.name for p in processes) or "none"
        raise LookupError(f"no essential process named {name!r} (known: {known})")
    raw = request.query.get("lines", str(TAIL_LINES))
    if not raw.isdigit():
        raise ValueError(f"lines={raw!r}: give a whole number of lines")
    path = log_of(spec, HomeLayout.at(request.home).logs)
    return {"name": name, "path": str(path), "lines": tail(path, int(raw))}


class ProcessCounts(msgspec.Struct, frozen=True):
    """Restarts decided (restart-process effects) and give-ups (process-gave-up marks), per
    essential process, since the log began."""

    restarts: dict[str, int] = msgspec.field(default_factory=dict)
    give_ups: dict[str, int] = msgspec.field(default_factory=dict)


def _tag(event: Event) -> str | None:
    body = event.data.get(event.kind) if isinstance(event.data, dict) else None
    tag = body.get("type") if isinstance(body, dict) else None
    return tag if isinstance(tag, str) else None


class ProcessTally(Projection[ProcessCounts]):
    """The survival layer's counts for /metrics (see ProcessCounts), every host's."""

    name = "survival-process-tally"
    kinds = frozenset({"effect", "mark"})

    def initial(self) -> ProcessCounts:
        return ProcessCounts()

    def apply(self, state: ProcessCounts, event: Event) -> ProcessCounts:
        tag = _tag(event)
        try:
            if tag == RestartProcess.tag():
                effect = decode_effect(event.data)
                if isinstance(effect, RestartProcess):
                    return msgspec.structs.replace(state, restarts=_plus(state.restarts,
                                                                         effect.name))
            elif tag == GaveUp.tag():
                mark = decode_mark(event)
                if isinstance(mark, GaveUp):
                    return msgspec.structs.replace(state, give_ups=_plus(state.give_ups,
                                                                         mark.name))
        except (UnknownEffect, msgspec.ValidationError):
            pass  # written by another version: not counted
        return state


def _plus(counts: dict[str, int], name: str) -> dict[str, int]:
    return {**counts, name: counts.get(name, 0) + 1}


def survival_metrics() -> tuple[LayerMetric, ...]:
    """The survival layer's families in /metrics: restarts and give-ups per process."""
    tally = ProcessTally()
    return (
        LayerMetric("pulse_process_restarts", "Restarts of an essential process the survival "
                    "layer decided (restart-process effects)", tally,
                    lambda s: s.restarts, label="process"),
        LayerMetric("pulse_process_give_ups", "Times the survival layer gave up restarting an "
                    "essential process (process-gave-up marks)", tally,
                    lambda s: s.give_ups, label="process"),
    )
