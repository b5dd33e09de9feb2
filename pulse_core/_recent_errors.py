"""Built-in projections every engine keeps beside the task projections."""

from __future__ import annotations

from pulse_core._events import Event
from pulse_core._snapshot import Projection

SERVICE_PREFIX = "service:"
"""The key (the supervisor's loop name) of a service's `error` events."""


class RecentErrors(Projection[tuple[int, ...]]):
    """When the last `keep` errors happened, oldest first (read by error_backoff): an error
    recorded late, after a store outage, counts at the time it was reported, not stored.

    A service's failures (key `service:<name>`: the web UI, a follower) are left out: a
    service serves people beside the engine, and its trouble must not slow the engine's
    reflexes; it is recorded, and restarted by the supervisor, all the same."""

    name = "errors"
    kinds = frozenset({"error"})
    keep = 100
    version = 2

    def initial(self) -> tuple[int, ...]:
        return ()

    def apply(self, state: tuple[int, ...], event: Event) -> tuple[int, ...]:
        if event.key.startswith(SERVICE_PREFIX):
            return state
        data = event.data if isinstance(event.data, dict) else {}
        at = data.get("reported_at") if data.get("late") is True else None
        if not isinstance(at, int) or isinstance(at, bool) or not 0 < at <= event.ts:
            return (*state[-(self.keep - 1):], event.ts)
        return tuple(sorted((*state, at))[-self.keep:])
