"""What the maintenance rule folds from the log: cycles begun and ended, cycles requested, and
human exchanges per identity since the last cycle began (a long session is a trigger).

Kinds (registered here):

- `maintenance-requested` (key `maintenance:requests`): somebody asked for a cycle
  (`request_cycle`); the next cycle to begin consumes every request before it.
- `maintenance-cycle-began` (key `maintenance:cycles`): a cycle began, written in the same
  append as its `activity-started`; its `cycle_start` is bound once and reused by every retry.
"""

from __future__ import annotations

import msgspec

from pulse_core._events import Event, EventDraft, register_kind
from pulse_core._pmap import PersistentMap
from pulse_core._snapshot import Projection
from pulse_core.store._base import EventStore

REQUESTS_KEY = "maintenance:requests"
CYCLES_KEY = "maintenance:cycles"
ENDINGS = frozenset({"activity-completed", "activity-failed", "activity-cancelled"})


class CycleRequested(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of maintenance-requested: why a cycle was asked for."""

    reason: str = ""


class CycleBegan(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of maintenance-cycle-began: the cycle (its activity id), its start (ms, bound
    once), what started it, and the log's newest seq when it began."""

    cycle: str
    cycle_start: int
    trigger: str = "scheduled"
    through_seq: int = 0


register_kind("maintenance-requested", "a maintenance cycle was asked for (on demand); key: "
              "maintenance:requests", CycleRequested)
register_kind("maintenance-cycle-began", "a maintenance cycle began (with its activity-started);"
              " key: maintenance:cycles", CycleBegan)


class LedgerState(msgspec.Struct, frozen=True):
    """The rule's view of maintenance: the last cycle begun, the cycles still running, the
    newest request, and human exchanges per identity since the last cycle began."""

    last_cycle: str = ""
    last_cycle_start: int | None = None
    last_began_seq: int = 0
    running: tuple[str, ...] = ()
    cycles: int = 0
    last_request_seq: int = 0
    last_request_reason: str = ""
    exchanges: PersistentMap[str, int] = msgspec.field(default_factory=PersistentMap)
    most_exchanges: int = 0

    @property
    def requested(self) -> bool:
        """A request came after the last cycle began."""
        return self.last_request_seq > self.last_began_seq


class MaintenanceLedger(Projection[LedgerState]):
    """The fold of maintenance cycles and requests the rule reads (see LedgerState)."""

    name = "maintenance"
    kinds = frozenset({"maintenance-requested", "maintenance-cycle-began", "human-exchange",
                       *ENDINGS})

    def initial(self) -> LedgerState:
        return LedgerState()

    def apply(self, state: LedgerState, event: Event) -> LedgerState:
        replace = msgspec.structs.replace
        if event.kind == "maintenance-cycle-began":
            began = event.payload(CycleBegan)
            return replace(state, last_cycle=began.cycle, last_cycle_start=began.cycle_start,
                           last_began_seq=event.seq, cycles=state.cycles + 1,
                           running=(*state.running, began.cycle), exchanges=PersistentMap(),
                           most_exchanges=0)
        if event.kind == "maintenance-requested":
            reason = event.payload(CycleRequested).reason
            return replace(state, last_request_seq=event.seq, last_request_reason=reason)
        if event.kind == "human-exchange":
            if not event.key.startswith("identity:") or not isinstance(event.data, dict) \
                    or event.data.get("role", "human") != "human":
                return state
            identity = event.key.removeprefix("identity:")
            count = state.exchanges.get(identity, 0) + 1
            return replace(state, exchanges=state.exchanges.set(identity, count),
                           most_exchanges=max(state.most_exchanges, count))
        cycle = event.key.removeprefix("activity:")
        if cycle in state.running:
            return replace(state, running=tuple(c for c in state.running if c != cycle))
        return state


async def request_cycle(store: EventStore, reason: str, *, origin: str = "agent") -> Event:
    """Ask for a maintenance cycle now (the on-demand trigger): the layer's rule starts one at
    its next tick, unless one is already pending or running. Returns the stored request."""
    draft = EventDraft("maintenance-requested", REQUESTS_KEY,
                       msgspec.to_builtins(CycleRequested(reason=reason)), origin=origin)
    return (await store.append([draft])).events[0]
