"""The survival layer's page in the web UI: each essential process as supervisorctl shows it
(RUNNING, STARTING, BACKOFF, FATAL), judged in the UI's process from the survival ledger it
folds and the newest `process-alive` sample, with the watchdog's own settings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from pulse_core import Essential, PageRequest, UiPage, VitalReading
from pulse_survival.config import ProcessPolicy
from pulse_survival.ledger import SurvivalLedger
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
