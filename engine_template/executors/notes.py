"""Note, an effect, and NoteExecutor, which appends each note once to a notes file."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pulse_core import Effect, ExecutionContext, Executor


class Note(Effect, tag="note"):
    """A line for the agent's humans to read."""

    text: str


class NoteExecutor(Executor):
    """Appends `<effect id> <text>` to `path`, once per effect even when an attempt is retried.

    The effect id is the same for every attempt of one effect: a side effect keyed by it is
    safe to run again after a crash.
    """

    handles = (Note,)
    timeout = 5.0

    def __init__(self, path: Path) -> None:
        self.path = path

    async def execute(self, effect: Note, ctx: ExecutionContext) -> dict[str, str]:
        await asyncio.to_thread(self._append_once, ctx.effect_id, effect.text)
        return {"note": effect.text, "path": str(self.path)}

    def _append_once(self, effect_id: str, text: str) -> None:
        line = f"{effect_id} {text}\n"
        if self.path.is_file() and line in self.path.read_text(encoding="utf-8"):
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as notes:
            notes.write(line)
