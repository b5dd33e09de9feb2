"""Built-in projections every engine keeps beside the task projections."""

from __future__ import annotations

from pulse_core._events import Event
from pulse_core._snapshot import Projection


class RecentErrors(Projection[tuple[int, ...]]):
    """Timestamps of the last `keep` error events, oldest first (read by error_backoff)."""

    name = "errors"
    kinds = frozenset({"error"})
    keep = 100

    def initial(self) -> tuple[int, ...]:
        return ()

    def apply(self, state: tuple[int, ...], event: Event) -> tuple[int, ...]:
        return (*state[-(self.keep - 1):], event.ts)
