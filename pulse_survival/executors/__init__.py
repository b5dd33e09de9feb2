"""The executors the survival rules need."""

from pulse_core import publish_face
from pulse_survival.executors.files import FileArchiveExecutor, FolderRefused, move_old_files
from pulse_survival.executors.notify import SEALED_ELSEWHERE, NotifyExecutor, WebhookFailed
from pulse_survival.executors.process import RestartProcessExecutor, write_pidfile
from pulse_survival.executors.rollback import EngineDirectory, NoEngineDirectory, RollbackExecutor

__all__ = [
    "SEALED_ELSEWHERE",
    "EngineDirectory",
    "FileArchiveExecutor",
    "FolderRefused",
    "NoEngineDirectory",
    "NotifyExecutor",
    "RestartProcessExecutor",
    "RollbackExecutor",
    "WebhookFailed",
    "move_old_files",
    "write_pidfile",
]

publish_face(__name__)
