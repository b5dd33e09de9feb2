"""The maintenance executor: runs the cycle a MaintenanceCycle effect asks for, off the tick.

The cycle's id is derived from the effect's id, so every attempt of one effect (a retry after
a failure, a re-claim after the engine restarted) resumes the same cycle activity and its
cycle_start. A scheduled cycle records the schedule's fire first (keyed by its due time), so
the schedule moves on exactly once however many engines share the log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pulse_adapters.maintenance._consolidation import Proposer
from pulse_adapters.maintenance._cycle import run_cycle, summary
from pulse_adapters.maintenance._rule import MaintenanceCycle, schedule_of
from pulse_adapters.maintenance._settings import ORIGIN, PRINCIPAL, MaintenanceSettings
from pulse_core import Backoff, ExecutionContext, Executor
from pulse_core.maintenance import Authority, ElementsReader, fire_schedule, read_activity


def cycle_id(effect_id: str) -> str:
    """The cycle (activity) id of the MaintenanceCycle effect `effect_id`."""
    return f"maintenance-{effect_id}"


class MaintenanceExecutor(Executor):
    """Runs maintenance cycles; `timeout` is the settings' `timeout_s`. A retry resumes the
    cycle its earlier attempt began. One elements reader is kept from cycle to cycle; with
    `checkpoints` (a folder: the layer gives the home's checkpoints/maintenance) it is saved
    there after each cycle, so the first cycle after a restart folds only the log's tail."""

    handles = (MaintenanceCycle,)
    max_attempts = 3
    backoff = Backoff(initial_ms=30_000, factor=2.0, max_ms=600_000)

    def __init__(self, settings: MaintenanceSettings | None = None,
                 proposer: Proposer | None = None, checkpoints: Path | None = None) -> None:
        self.settings = settings or MaintenanceSettings()
        self.proposer = proposer
        self.timeout = self.settings.timeout_s
        self.checkpoints = checkpoints
        self._reader: ElementsReader | None = None  # kept: later cycles fold only what is new

    @property
    def name(self) -> str:
        return "maintenance"

    async def execute(self, effect: MaintenanceCycle, ctx: ExecutionContext) -> Any:
        cycle = cycle_id(ctx.effect_id)
        schedule = schedule_of(self.settings.schedule)
        if effect.trigger == "scheduled" and effect.due_at is not None and schedule is not None \
                and await read_activity(ctx.events, cycle) is None:
            await fire_schedule(ctx.events, schedule, effect.due_at, ctx.clock.now_ms(),
                                origin=ORIGIN)
        if self._reader is None or self._reader.store is not ctx.events:
            self._reader = ElementsReader(ctx.events, checkpoints=self.checkpoints)
        report = await run_cycle(
            ctx.events, self.settings, cycle=cycle, trigger=effect.trigger, clock=ctx.clock,
            authority=Authority(ctx.events, {PRINCIPAL: self.settings.grants}),
            proposer=self.proposer, reader=self._reader)
        return summary(report)
