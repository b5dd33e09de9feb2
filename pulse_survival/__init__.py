"""pulse_survival: the P0 layer every Engine runs outermost: 4 watchers, 7 rules, executors.

Zero LLM and zero network in its decisions; only the network watcher probes the network.
"""

from pulse_survival.config import (
    ErrorLogPolicy,
    Essential,
    LlmPolicy,
    NetworkTargets,
    NotifySinks,
    ProcessPolicy,
    ResourceThresholds,
    RollbackPolicy,
    SurvivalConfig,
    SurvivalConfigError,
    load_config,
)
from pulse_survival.effects import ArchiveSessions, Cleanup, Notify, RestartProcess, Rollback
from pulse_survival.executors import EngineDirectory, NoEngineDirectory
from pulse_survival.layer import RULE_ORDER, SurvivalLayer, survival_layer
from pulse_survival.ledger import SurvivalLedger, SurvivalLedgerData

__all__ = [
    "RULE_ORDER",
    "ArchiveSessions",
    "Cleanup",
    "EngineDirectory",
    "ErrorLogPolicy",
    "Essential",
    "LlmPolicy",
    "NetworkTargets",
    "NoEngineDirectory",
    "Notify",
    "NotifySinks",
    "ProcessPolicy",
    "ResourceThresholds",
    "RestartProcess",
    "Rollback",
    "RollbackPolicy",
    "SurvivalConfig",
    "SurvivalConfigError",
    "SurvivalLayer",
    "SurvivalLedger",
    "SurvivalLedgerData",
    "load_config",
    "survival_layer",
]
