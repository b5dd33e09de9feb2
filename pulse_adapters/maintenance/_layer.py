"""The maintenance layer: the rule, the executor and the projections they read, built from one
MaintenanceSettings (config.json's `"layers": {"maintenance": {...}}`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from pulse_adapters.llm import ChatClient
from pulse_adapters.maintenance._consolidation import Proposer
from pulse_adapters.maintenance._executor import MaintenanceExecutor
from pulse_adapters.maintenance._ledger import MaintenanceLedger
from pulse_adapters.maintenance._page import maintenance_page
from pulse_adapters.maintenance._proposer import LlmProposer
from pulse_adapters.maintenance._rule import MaintenanceCycle, MaintenanceRule
from pulse_adapters.maintenance._settings import (
    LAYER,
    MaintenanceSettings,
    MaintenanceSettingsError,
    load_settings,
)
from pulse_core import Engine, HomeLayout, Layer, LayerContext, Lifespan
from pulse_core.maintenance import Beliefs, MemoryElements, Schedules, SleepTasks, Watches


def closing(client: ChatClient) -> Lifespan:
    """The layer's lifespan when a model proposes consolidations: the model client, closed
    when the engine closes."""

    @contextlib.asynccontextmanager
    async def lifespan(engine: Engine) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await client.aclose()

    return lifespan


def _client(settings: MaintenanceSettings) -> ChatClient:
    config = settings.consolidation
    problem = config.key_problem()
    if problem is not None:
        raise MaintenanceSettingsError(
            f"layer {LAYER!r}: setting `consolidation.api_key_env` {problem}")
    return config.client()


def layer(settings: Any, context: LayerContext) -> Layer:
    """The maintenance layer (entry point `maintenance` in group `pulse.layers`): the rule,
    the executor, the maintenance ledger, and the sleep-task, watch, schedule, element and
    belief projections, built from `settings` (MaintenanceSettings, config.json's object, or
    None for the defaults). MaintenanceSettingsError names a wrong setting."""
    valid = load_settings(settings)
    proposer: Proposer | None = None
    lifespan: Lifespan | None = None
    if valid.consolidation.proposer == "llm":
        client = _client(valid)
        proposer = LlmProposer(client)
        lifespan = closing(client)
    return Layer(LAYER, rules=(MaintenanceRule(valid),),
                 executors=(MaintenanceExecutor(
                     valid, proposer, checkpoints=HomeLayout(context.home).checkpoints
                     / "maintenance"),),
                 projections=(MaintenanceLedger(), Schedules(), SleepTasks(), Watches(),
                              MemoryElements(), Beliefs()),
                 lifespan=lifespan, emits=(MaintenanceCycle,), ui=(maintenance_page(),))
