"""Types shared by this engine's watchers, rules and executors."""

from __future__ import annotations

import msgspec


class InboxReading(msgspec.Struct, frozen=True):
    """What the inbox watcher reports: how many message files wait in the inbox folder."""

    count: int
