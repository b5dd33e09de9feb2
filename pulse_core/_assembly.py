"""What an engine is made of, assembled once when it is built: its layers in their fixed order
(the survival layer outermost, the business layer innermost), their watchers, executors and
projections, the one rule chain, and the host its decisions are bound to."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pulse_core._clock import Clock
from pulse_core._effects import Executor
from pulse_core._errors import PulseError, StoreError, SurvivalLocked
from pulse_core._layer import (
    EngineDirectory,
    Layer,
    LayerContext,
    check_layers,
    load_survival_layer,
)
from pulse_core._recent_errors import RecentErrors
from pulse_core._rules import Rule, RuleChain, clamp_tick, dedup, error_backoff, rule_name
from pulse_core._snapshot import Projection
from pulse_core._tasks import AgentCapabilityStats, PendingTasks, Tasks
from pulse_core._watchers import Watcher
from pulse_core.memory import Memory
from pulse_core.store import parse_store_url


def default_builtin_rules() -> list[Rule]:
    """The built-in rules every engine runs between the survival layer and the other layers."""
    return [clamp_tick(), error_backoff(), dedup()]


def builtin_projections() -> list[Projection[Any]]:
    """The projections every engine folds besides its layers': tasks, the pending ones,
    agents' capability stats, recent errors and memory."""
    return [Tasks(), PendingTasks(), AgentCapabilityStats(), RecentErrors(), Memory()]


def placement(store: str | None, host: str | None) -> str:
    """The host an engine's effects and marks are bound to: its own where the log may be
    shared across hosts (PostgreSQL), '' where it is the engine's alone (SQLite)."""
    try:
        shared = store is not None and parse_store_url(store).spans_hosts
    except StoreError:
        return ""  # open() reports the URL
    return (host or socket.gethostname()) if shared else ""


def check_not_survival(survival: Layer, rules: Sequence[Rule]) -> None:
    """Refuse (SurvivalLocked) any of `rules` that is one of the survival layer's."""
    names = {rule_name(r) for r in survival.rules}
    for rule in rules:
        if rule_name(rule) in names:
            raise SurvivalLocked(
                f"rule {rule_name(rule)!r} is a survival rule: it is always present, "
                "outermost, in a fixed order, and cannot be added, removed or reordered"
            )


@dataclass(frozen=True)
class Assembly:
    """An engine's parts: `layers` outermost first (survival, the others, business), what
    they bring, and the rule chain over all their rules."""

    placement: str
    survival: Layer
    business: Layer
    layers: tuple[Layer, ...]
    watchers: tuple[Watcher, ...]
    executors: tuple[Executor, ...]
    projections: tuple[Projection[Any], ...]
    chain: RuleChain


def assemble(
    home: Path,
    clock: Clock,
    *,
    layers: Sequence[Layer],
    business: Layer | None,
    watchers: Sequence[Watcher],
    rules: Sequence[Rule],
    executors: Sequence[Executor],
    projections: Sequence[Projection[Any]],
    builtin_rules: Sequence[Rule] | None,
    store: str | None,
    host: str | None,
    survival: Any,
    engine_directory: EngineDirectory | None,
    default_tick_ms: int,
    rule_timeout: float,
) -> Assembly:
    """Build an engine's parts as the Engine's arguments of the same names describe them;
    refuse (PulseError) what could not run, and a survival rule anywhere but outermost."""
    if business is not None and (watchers or rules or executors or projections):
        raise PulseError("give the business code either as business=Layer(...) or as "
                         "watchers=/rules=/executors=/projections=, not both")
    if business is None:
        business = Layer("business", watchers=watchers, rules=rules, executors=executors,
                         projections=projections)
    if builtin_rules is None:
        builtin_rules = default_builtin_rules()
    bound = placement(store, host)
    essentials = tuple(e for la in (*layers, business) for e in la.essentials)
    outermost = load_survival_layer(survival, LayerContext(home, clock, engine_directory, bound,
                                                      essentials))
    every = (outermost, *layers, business)
    check_layers(every)
    check_not_survival(outermost, [*builtin_rules, *(r for la in every[1:] for r in la.rules)])
    chain = RuleChain(
        [("survival", outermost.rules), ("builtin", builtin_rules),
         *((la.name, la.rules) for la in layers), (business.name, business.rules)],
        default_tick_ms=default_tick_ms, business_timeout=rule_timeout)
    return Assembly(
        placement=bound, survival=outermost, business=business, layers=every,
        watchers=tuple(w for la in every for w in la.watchers),
        executors=tuple(e for la in every for e in la.executors),
        projections=(*builtin_projections(), *(p for la in every for p in la.projections)),
        chain=chain,
    )
