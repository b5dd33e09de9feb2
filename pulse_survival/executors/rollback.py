"""rollback: ask the engine directory to go back; the CLI issue implements the git side."""

from __future__ import annotations

from typing import Any

from pulse_core import EngineDirectory, ExecutionContext, Executor, PulseError
from pulse_survival.effects import Rollback

__all__ = ["EngineDirectory", "NoEngineDirectory", "RollbackExecutor"]


class NoEngineDirectory:
    """The engine runs without an engine directory: a rollback has nothing to act on."""

    async def rollback(self, revision: str | None, reason: str) -> str:
        raise PulseError(
            "rollback requested but this engine has no engine directory — run it from a home "
            f"made by `upulse init` (reason: {reason})"
        )


class RollbackExecutor(Executor):
    """Calls the engine directory's rollback and reports the revision it went back to."""

    handles = (Rollback,)
    timeout = 120.0
    max_attempts = 2

    def __init__(self, directory: EngineDirectory) -> None:
        self.directory = directory

    async def execute(self, effect: Rollback, ctx: ExecutionContext) -> dict[str, Any]:
        revision = await self.directory.rollback(effect.revision, effect.reason)
        return {"revision": revision, "emergency": effect.emergency}
