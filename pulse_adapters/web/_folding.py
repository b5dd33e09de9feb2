"""The one way the UI folds the log as it grows: only the kinds a fold reads, only what was
appended since its last read, a page at a time, yielding to the loop between pages, so a long
log never holds a request (or a scrape) for long."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import ClassVar

from pulse_core import Event, EventStore

PAGE = 2_000
"""Events read per page."""


class LogFold:
    """Base of the UI's folds: `catch_up` hands `fold` each event of `kinds` (None: every
    kind) appended since the last call, in order. `seq` is how far it has folded, `head` the
    newest seq the last read saw."""

    kinds: ClassVar[Sequence[str] | None] = None

    def __init__(self, events: EventStore) -> None:
        self.events = events
        self.seq = 0
        self.head = 0
        self._lock = asyncio.Lock()

    async def catch_up(self) -> None:
        """Fold the events appended since the last call."""
        async with self._lock:
            kinds = None if self.kinds is None else list(self.kinds)
            while True:
                page = await self.events.read_page(self.seq, kinds=kinds, limit=PAGE)
                for event in page.events:
                    self.fold(event)
                short = len(page.events) < PAGE
                self.seq = max(self.seq, page.last_seq if short else page.events[-1].seq)
                self.head = max(self.head, page.last_seq)
                if short:
                    return
                await asyncio.sleep(0)

    def fold(self, event: Event) -> None:
        """Take one event into the fold's state."""
        raise NotImplementedError
