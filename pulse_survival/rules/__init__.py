"""The seven survival rules, outermost first."""

from pulse_core import publish_face
from pulse_survival.rules.base import SurvivalRule
from pulse_survival.rules.conditions import ErrorEscalate, NetworkWatchdog, ResourceGuard
from pulse_survival.rules.process import HOUR_MS, LlmWatchdog, ProcessWatchdog, restart_backoff
from pulse_survival.rules.rollback import AutoRollback, PanicRollback

__all__ = [
    "HOUR_MS",
    "AutoRollback",
    "ErrorEscalate",
    "LlmWatchdog",
    "NetworkWatchdog",
    "PanicRollback",
    "ProcessWatchdog",
    "ResourceGuard",
    "SurvivalRule",
    "restart_backoff",
]

publish_face(__name__)
