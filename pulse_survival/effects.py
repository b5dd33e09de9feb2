"""The effects the survival rules emit. Each is data; an executor in executors/ acts on it."""

from __future__ import annotations

from pulse_core import Effect, Quote, Rollback

__all__ = ["SURVIVAL_TAGS", "ArchiveSessions", "Cleanup", "Notify", "RestartProcess", "Rollback",
           "StopProcess"]

SURVIVAL_TAGS = frozenset(
    {"restart-process", "stop-process", "archive-sessions", "cleanup", "notify", "rollback"}
)


class RestartProcess(Effect, tag="restart-process"):
    """Start an essential process again, detached, from its argv.

    `env_names` names the variables its configured `env` adds; their values are taken from
    the configuration when the restart runs, never stored in the log (they may be secrets).
    `env` holds values only in effects written before that, and is still honoured.
    `replace`: stop the running process first (an operator's restart); without it a process
    already running is adopted, never started twice. `request`: the seq of the operator's
    `process-requested` event this restart answers (None: the watchdog's own).
    """

    name: str
    argv: tuple[str, ...]
    cwd: str | None = None
    env: dict[str, str] = {}  # noqa: RUF012 - msgspec copies mutable defaults
    env_names: tuple[str, ...] = ()
    pidfile: str | None = None
    log: str | None = None
    reason: str = ""
    replace: bool = False
    request: int | None = None

    def dedup_key(self) -> str:
        return f"restart-process:{self.name}"


class StopProcess(Effect, tag="stop-process"):
    """Stop essential process `name` (SIGTERM, then SIGKILL after `wait_s`), found as the
    process watcher finds it; `request` is the seq of the operator's `process-requested`
    event it answers."""

    name: str
    request: int | None = None
    reason: str = ""
    wait_s: float = 10.0

    def dedup_key(self) -> str:
        return f"stop-process:{self.name}"


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
    """Tell the agent and its humans something: `topic` groups notices of one condition.

    `text` is pulse's own words. Text pulse only passes on (log lines, a transcript, a model's
    output) goes in `quoted`: agent hosts show each quote fenced as data, labelled with its
    source, never as pulse's words (`pulse_adapters.agents.fence_untrusted`).
    """

    topic: str
    level: str
    text: str
    quoted: tuple[Quote, ...] = ()

    def dedup_key(self) -> str:
        key = f"notify:{self.topic}:{self.level}:{self.text}"
        if self.quoted:
            key += ":" + "\x00".join(f"{q.source}\x01{q.text}" for q in self.quoted)
        return key


