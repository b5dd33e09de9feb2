"""A follower's trouble reading an agent host's own store (its transcripts)."""

from __future__ import annotations

import logging
from pathlib import Path

from pulse_core import EventStore, error_draft


class StoreTrouble:
    """What a follower of a host's store (locked, corrupt, replaced for a while) says of it:
    a warning in the log and one `error` event (key `service:<service>`, with the store's
    path) per distinct problem, said again only once a read has succeeded in between."""

    def __init__(self, service: str, path: Path, log: logging.Logger, retry_s: float) -> None:
        self.service = service
        self.path = path
        self.log = log
        self.retry_s = retry_s
        self._said: str | None = None

    async def report(self, events: EventStore, exc: Exception, host: str = "") -> None:
        """Say `exc`, unless it is the problem said last."""
        said = f"{self.path}: {type(exc).__name__}: {exc}"
        if said == self._said:
            return
        self._said = said
        self.log.warning("pulse: %s: cannot read %s — retrying every %g s", self.service, said,
                         self.retry_s)
        await events.append([error_draft(f"service:{self.service}", exc,
                                         {"store": str(self.path)}, host=host)])

    def cleared(self) -> None:
        """A read succeeded: the next problem is said again."""
        self._said = None
