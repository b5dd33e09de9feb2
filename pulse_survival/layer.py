"""The survival layer: what the engine installs outermost, found through the `pulse.survival`
entry point (`pulse_survival.layer:layer`); pulse_core never imports this package."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pulse_core import (
    EngineDirectory,
    Essential,
    Executor,
    HomeLayout,
    Layer,
    LayerContext,
    Rule,
    SurvivalLocked,
    Watcher,
)
from pulse_survival.config import SurvivalConfig, SurvivalConfigError, load_config
from pulse_survival.executors import (
    FileArchiveExecutor,
    NoEngineDirectory,
    NotifyExecutor,
    RestartProcessExecutor,
    RollbackExecutor,
)
from pulse_survival.ledger import SurvivalLedger
from pulse_survival.page import survival_metrics, survival_page
from pulse_survival.rules import (
    AutoRollback,
    ErrorEscalate,
    LlmWatchdog,
    NetworkWatchdog,
    PanicRollback,
    ProcessWatchdog,
    ResourceGuard,
)
from pulse_survival.watchers import (
    ErrorLogWatcher,
    NetworkWatcher,
    ProcessAliveWatcher,
    SystemResourceWatcher,
)

RULE_ORDER = ("panic_rollback", "auto_rollback", "process_watchdog", "resource_guard",
              "llm_watchdog", "network_watchdog", "error_escalate")


def survival_config(settings: Any) -> SurvivalConfig:
    """`settings` as a SurvivalConfig: one already, a config.json mapping (validated; errors
    name the field and the fields allowed), or None for the defaults.

    Anything else (False, a list, another layer) is refused with SurvivalLocked: the survival
    layer can be tuned, never switched off or replaced.
    """
    if settings is None:
        return SurvivalConfig()
    if isinstance(settings, SurvivalConfig):
        return settings
    if isinstance(settings, Mapping):
        return load_config(settings)
    raise SurvivalLocked(
        f"survival={settings!r}: the survival layer cannot be switched off or replaced; "
        "tune it with a pulse_survival.SurvivalConfig or a config.json `survival` object"
    )


def survival_layer(config: SurvivalConfig, home: Path,
                   directory: EngineDirectory | None = None, *, host: str = "",
                   essentials: Sequence[Essential] = ()) -> Layer:
    """The four watchers, seven rules (outermost first), their executors and the ledger
    (of `host`'s survival alone, where engines of several hosts share the log), keeping
    alive `config.processes` and the `essentials` other layers declare."""
    processes = (*config.processes, *essentials)
    names = [p.name for p in processes]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise SurvivalConfigError(
            f"essential process names must be unique across survival.processes and the "
            f"layers' essentials; repeated: {', '.join(repeated)} — rename one")
    restartable = (*processes, *((config.llm.restart,) if config.llm.restart else ()))
    disks = config.disk_paths or (str(home),)
    watchers: tuple[Watcher, ...] = (
        SystemResourceWatcher(disks, config.resource.memory_pct, config.resource.disk_pct,
                              interval=config.resource_interval_s),
        ProcessAliveWatcher(processes),
        NetworkWatcher(config.network),
        ErrorLogWatcher(config.error_log.files, config.error_log.patterns,
                        config.error_log.max_line_bytes, interval=config.error_log.interval_s),
    )
    rules: tuple[Rule, ...] = (
        PanicRollback(config.rollback),
        AutoRollback(config.rollback),
        ProcessWatchdog(processes, config.process),
        ResourceGuard(config.resource),
        LlmWatchdog(config.llm),
        NetworkWatchdog(config.network),
        ErrorEscalate(config.error_log),
    )
    executors: tuple[Executor, ...] = (
        RestartProcessExecutor(HomeLayout.at(home).logs, restartable),
        FileArchiveExecutor(home),
        NotifyExecutor(config.notify),
        RollbackExecutor(directory or NoEngineDirectory()),
    )
    ledger = SurvivalLedger(host)
    return Layer("survival", watchers=watchers, rules=rules, executors=executors,
                 projections=(ledger,), ui=(survival_page(processes, config.process, ledger),),
                 metrics=survival_metrics())


def layer(settings: Any, context: LayerContext) -> Layer:
    """The survival layer's entry point (group `pulse.survival`): `settings` as
    `survival_config` takes them, built for `context`'s home and engine directory."""
    return survival_layer(survival_config(settings), context.home, context.engine_directory,
                          host=context.host, essentials=context.essentials)
