"""The seven survival rules, outermost first."""

from pulse_survival.rules.base import SurvivalRule
from pulse_survival.rules.conditions import ErrorEscalate, NetworkWatchdog, ResourceGuard
from pulse_survival.rules.process import LlmWatchdog, ProcessWatchdog
from pulse_survival.rules.rollback import AutoRollback, PanicRollback

__all__ = [
    "AutoRollback",
    "ErrorEscalate",
    "LlmWatchdog",
    "NetworkWatchdog",
    "PanicRollback",
    "ProcessWatchdog",
    "ResourceGuard",
    "SurvivalRule",
]
