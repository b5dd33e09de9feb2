"""The survival layer in the web UI: its page, each essential process as supervisorctl shows
it (RUNNING, STARTING, BACKOFF, FATAL), judged in the UI's process from the survival ledger it
folds and the newest `process-alive` sample, with the watchdog's own settings; and its
metrics, the restarts and give-ups of each process since the log began (ProcessTally)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from pulse_core import (
    Essential,
    Event,
    LayerMetric,
    PageRequest,
    Projection,
    UiPage,
    UnknownEffect,
    VitalReading,
    decode_effect,
    decode_mark,
)
from pulse_survival.config import ProcessPolicy
from pulse_survival.effects import RestartProcess
from pulse_survival.ledger import SurvivalLedger
from pulse_survival.marks import GaveUp
from pulse_survival.supervised import ALIVE_KEY, supervised_states


def survival_page(processes: Sequence[Essential], policy: ProcessPolicy,
                  ledger: SurvivalLedger) -> UiPage:
    """The Processes page of the survival layer that keeps `processes` alive under
    `policy`, reading `ledger`."""

    async def view(request: PageRequest) -> dict[str, Any]:
        latest = (await request.vitals.latest([ALIVE_KEY])).get(ALIVE_KEY)
        vitals = {} if latest is None else {
            ALIVE_KEY: VitalReading(latest, max(request.now - latest.ts, 0))}
        snapshot = msgspec.structs.replace(request.snapshot, vitals=vitals, at=request.now)
        return {"now": request.now, "processes": msgspec.to_builtins(
            supervised_states(snapshot, processes, policy))}

    return UiPage("processes", "Processes", view, projections=(ledger,),
                  assets="pulse_survival:ui")


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
