"""InboxWatcher: counts the message files in a folder and wakes the tick when more arrive."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec

from pulse_core import Sample, Watcher

from ..types import InboxReading


class InboxWatcher(Watcher):
    """The number of files in `folder` (hidden ones aside), as vitals key `inbox`."""

    name = "inbox"
    interval = 5.0

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    async def collect(self) -> InboxReading:
        return InboxReading(count=await self.in_thread(self._count))

    def _count(self) -> int:
        if not self.folder.is_dir():
            return 0
        return sum(1 for p in self.folder.iterdir() if p.is_file() and not p.name.startswith("."))

    def should_wake(self, window: Sequence[Sample]) -> bool:
        """Wake the tick as soon as the count goes up, rather than at its next interval."""
        counts = [msgspec.convert(s.data, InboxReading).count for s in window[-2:] if s.ok]
        return len(counts) == 2 and counts[1] > counts[0]
