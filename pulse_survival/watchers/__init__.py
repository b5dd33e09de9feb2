"""The four survival watchers."""

from pulse_core import publish_face
from pulse_survival.watchers.errorlog import LATEST, ErrorLogWatcher, ErrorTotals, error_totals
from pulse_survival.watchers.network import NetworkWatcher, network_outage
from pulse_survival.watchers.processes import ProcessAliveWatcher, find_process
from pulse_survival.watchers.resources import SystemResourceWatcher, under_pressure

__all__ = [
    "LATEST",
    "ErrorLogWatcher",
    "ErrorTotals",
    "NetworkWatcher",
    "ProcessAliveWatcher",
    "SystemResourceWatcher",
    "error_totals",
    "find_process",
    "network_outage",
    "under_pressure",
]

publish_face(__name__)
