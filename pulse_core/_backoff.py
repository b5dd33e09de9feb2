"""The one retry delay every loop of pulse waits by: executors, the supervisor, error reports,
PostgreSQL's notification listener and the layers that retry on their own."""

from __future__ import annotations

import random

import msgspec


class Backoff(msgspec.Struct, frozen=True):
    """Delay before retry n: initial_ms * factor**(n-1), capped at max_ms, with jitter."""

    initial_ms: int = 1_000
    factor: float = 2.0
    max_ms: int = 300_000
    jitter: float = 0.1

    def delay_ms(self, attempt: int) -> int:
        """The delay after failed attempt number `attempt` (1-based)."""
        base = min(self.max_ms, self.initial_ms * self.factor ** max(attempt - 1, 0))
        return int(base * (1 + random.uniform(-self.jitter, self.jitter)))
