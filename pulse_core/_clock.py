"""The engine clock: event timestamps, leases and backoffs all read it, so tests can drive time."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Milliseconds since the Unix epoch, as the engine sees them."""

    def now_ms(self) -> int: ...


class SystemClock:
    """Wall-clock time."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to; for deterministic tests and dry runs."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> int:
        """Move forward by `ms` and return the new time."""
        if ms < 0:
            raise ValueError(f"a clock cannot go back (advance by {ms} ms)")
        self._now += ms
        return self._now
