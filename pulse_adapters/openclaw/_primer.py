"""The session primer as a bootstrap file of the agent's workspace.

OpenClaw builds each session's context from its workspace's bootstrap files; its bundled
`bootstrap-extra-files` hook adds more by path. The service keeps pulse's session primer (the
latest working state, `pulse_adapters.maintenance.session_primer`) in one such file: written
at start and again after each working-state refresh whose primer differs, atomically (a
reader sees the old file or the new one), owner-only, and recorded as
`openclaw-primer-written`. A file that cannot be written is recorded as an `error` event once
per distinct problem and written again at the next refresh.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from pulse_adapters.maintenance import WORKING_STATE, session_primer
from pulse_adapters.openclaw._settings import OpenClawSettings
from pulse_core import (
    EventDraft,
    EventStore,
    HomePermissionDenied,
    error_draft,
    register_kind,
    write_private,
)

if TYPE_CHECKING:
    from pulse_core import Engine

PRIMER_WRITTEN = "openclaw-primer-written"
ORIGIN = "executor:openclaw-primer"
HEADING = "# pulse: the agent's working state\n\n"
NONE_YET = "No maintenance cycle has refreshed the working state yet."


class PrimerWritten(msgspec.Struct, frozen=True, kw_only=True):
    """openclaw-primer-written: the session primer now in `path`, `chars` long."""

    path: str
    chars: int


register_kind(PRIMER_WRITTEN, "pulse's session primer was written to the OpenClaw agent's "
                              "workspace; key: openclaw-primer", PrimerWritten)


def write_primer(path: Path, text: str) -> None:
    """Replace `path` with `text` (`pulse_core.write_private`: atomic, owner-only), making
    its folder first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, text.encode())


def read_text(path: Path) -> str | None:
    """`path`'s text, or None when there is none to read."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


class PrimerFile:
    """The layer's service `openclaw-primer` (see the module docstring)."""

    name = "openclaw-primer"

    def __init__(self, settings: OpenClawSettings) -> None:
        self.path = settings.primer_file()
        self.max_chars = settings.primer.max_chars
        self.failure: str | None = None

    async def __call__(self, engine: Engine) -> None:
        events = engine.events
        since = await events.last_seq()
        await self.refresh(events)
        async for _ in events.changes(since, kinds=[WORKING_STATE]):
            await self.refresh(events)

    async def text(self, events: EventStore) -> str:
        """What the file should hold now."""
        primer = await session_primer(events, max_chars=self.max_chars)
        return f"{HEADING}{primer or NONE_YET}\n"

    async def refresh(self, events: EventStore) -> None:
        """Write the primer unless the file holds it already; record what happened."""
        text = await self.text(events)
        if await asyncio.to_thread(read_text, self.path) == text:
            return
        try:
            await asyncio.to_thread(write_primer, self.path, text)
        except (OSError, HomePermissionDenied) as exc:
            problem = f"{type(exc).__name__}: {exc}"
            if problem != self.failure:
                self.failure = problem
                await events.append([error_draft(f"service:{self.name}", exc,
                                                 {"path": str(self.path)})])
            return
        self.failure = None
        await events.append([EventDraft(PRIMER_WRITTEN, "openclaw-primer",
                                        PrimerWritten(path=str(self.path), chars=len(text)),
                                        origin=ORIGIN)])
