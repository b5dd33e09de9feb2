"""The executors the survival rules need."""

from pulse_survival.executors.files import FileArchiveExecutor, move_old_files
from pulse_survival.executors.notify import NotifyExecutor
from pulse_survival.executors.process import RestartProcessExecutor, write_pidfile
from pulse_survival.executors.rollback import EngineDirectory, NoEngineDirectory, RollbackExecutor

__all__ = [
    "EngineDirectory",
    "FileArchiveExecutor",
    "NoEngineDirectory",
    "NotifyExecutor",
    "RestartProcessExecutor",
    "RollbackExecutor",
    "move_old_files",
    "write_pidfile",
]
