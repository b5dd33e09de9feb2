"""The effects the survival rules emit. Each is data; an executor in executors/ acts on it."""

from __future__ import annotations

from pulse_core import Effect, Rollback

__all__ = ["SURVIVAL_TAGS", "ArchiveSessions", "Cleanup", "Notify", "RestartProcess", "Rollback"]

SURVIVAL_TAGS = frozenset(
    {"restart-process", "archive-sessions", "cleanup", "notify", "rollback"}
)


class RestartProcess(Effect, tag="restart-process"):
    """Start an essential process again, detached, from its argv.

    `env_names` names the variables its configured `env` adds; their values are taken from
    the configuration when the restart runs, never stored in the log (they may be secrets).
    `env` holds values only in effects written before that, and is still honoured.
    """

    name: str
    argv: tuple[str, ...]
    cwd: str | None = None
    env: dict[str, str] = {}  # noqa: RUF012 - msgspec copies mutable defaults
    env_names: tuple[str, ...] = ()
    pidfile: str | None = None
    log: str | None = None
    reason: str = ""

    def dedup_key(self) -> str:
        return f"restart-process:{self.name}"


class ArchiveSessions(Effect, tag="archive-sessions"):
    """Move agent session files older than `older_than_s` from `folders` into `archive_to`."""

    folders: tuple[str, ...]
    archive_to: str
    older_than_s: int
    max_files: int

    def dedup_key(self) -> str:
        return "archive-sessions"


class Cleanup(Effect, tag="cleanup"):
    """Move old files out of temp folders into `archive_to`, and collect expired vitals."""

    folders: tuple[str, ...]
    archive_to: str
    older_than_s: int
    max_files: int
    vitals_gc: bool = True

    def dedup_key(self) -> str:
        return "cleanup"


class Notify(Effect, tag="notify"):
    """Tell the agent and its humans something: `topic` groups notices of one condition."""

    topic: str
    level: str
    text: str

    def dedup_key(self) -> str:
        return f"notify:{self.topic}:{self.level}:{self.text}"


