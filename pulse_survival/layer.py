"""The survival layer as the Engine installs it: outermost, always, never from user code."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from pulse_survival.config import SurvivalConfig

if TYPE_CHECKING:
    from pulse_core.effects import Executor
    from pulse_core.rules import Rule
    from pulse_core.snapshot import Projection
    from pulse_core.watch import Watcher
    from pulse_survival.executors import EngineDirectory


class SurvivalLayer(NamedTuple):
    """What the survival layer adds to every engine; user code cannot remove any of it."""

    watchers: tuple[Watcher, ...]
    rules: tuple[Rule, ...]
    executors: tuple[Executor, ...]
    projections: tuple[Projection[Any], ...]


RULE_ORDER = ("panic_rollback", "auto_rollback", "process_watchdog", "resource_guard",
              "llm_watchdog", "network_watchdog", "error_escalate")


def survival_layer(config: SurvivalConfig, home: Path,
                   directory: EngineDirectory | None = None) -> SurvivalLayer:
    """The four watchers, seven rules (outermost first), their executors and the ledger."""
    from pulse_survival.executors import (
        FileArchiveExecutor,
        NoEngineDirectory,
        NotifyExecutor,
        RestartProcessExecutor,
        RollbackExecutor,
    )
    from pulse_survival.ledger import SurvivalLedger
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

    disks = config.disk_paths or (str(home),)
    watchers: tuple[Watcher, ...] = (
        SystemResourceWatcher(disks, config.resource.memory_pct, config.resource.disk_pct,
                              interval=config.resource_interval_s),
        ProcessAliveWatcher(config.processes),
        NetworkWatcher(config.network),
        ErrorLogWatcher(config.error_log.files, config.error_log.patterns,
                        config.error_log.max_line_bytes, interval=config.error_log.interval_s),
    )
    rules: tuple[Rule, ...] = (
        PanicRollback(config.rollback),
        AutoRollback(config.rollback),
        ProcessWatchdog(config.processes, config.process),
        ResourceGuard(config.resource),
        LlmWatchdog(config.llm),
        NetworkWatchdog(config.network),
        ErrorEscalate(config.error_log),
    )
    executors: tuple[Executor, ...] = (
        RestartProcessExecutor(home / "logs"),
        FileArchiveExecutor(home),
        NotifyExecutor(config.notify),
        RollbackExecutor(directory or NoEngineDirectory()),
    )
    return SurvivalLayer(watchers, rules, executors, (SurvivalLedger(),))
