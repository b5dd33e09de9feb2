"""What the maintenance rule folds from the log: cycles begun and ended, cycles requested, and
human exchanges per identity since the last cycle began (a long session is a trigger).

Kinds (registered here):

- `maintenance-requested` (key `maintenance:requests`): somebody asked for a cycle
  (`request_cycle`); the next cycle to begin consumes every request before it.
- `maintenance-cycle-began` (key `maintenance:cycles`): a cycle began, written in the same
  append as its `activity-started`; its `cycle_start` is bound once and reused by every retry.
  Only one on that key from origin `executor:maintenance` counts, and its `cycle_start` is
  never later than the event's own time (a forged far-future start postpones nothing).

The ledger also keeps the armed delta watches' conditions and which of them a change matched
since the last cycle began (WatchCondition.matches, the predicate the watch evaluation uses),
so a matching change starts a `watch` cycle at the next tick instead of waiting for the
schedule.
"""

from __future__ import annotations

import msgspec

from pulse_adapters.maintenance._settings import ORIGIN
from pulse_core import Event, EventDraft, PersistentMap, Projection, register_kind
from pulse_core.maintenance import WatchArmed, WatchCondition, is_machinery
from pulse_core.store import EventStore

REQUESTS_KEY = "maintenance:requests"
CYCLES_KEY = "maintenance:cycles"
ENDINGS = frozenset({"activity-completed", "activity-failed", "activity-cancelled"})
MAX_RUNNING = 64
"""The ledger keeps at most this many running cycles (the newest): a cycle that never ends
does not grow the state for ever (the next cycle closes abandoned ones from the log)."""


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
    """The rule's view of maintenance: the last cycle begun, the cycles still running (the
    newest MAX_RUNNING), the newest request, human exchanges per identity since the last
    cycle began, the armed delta watches' conditions (`deltas`, by watch id) and the delta
    watches a change matched since the last cycle began (`matched`, oldest first)."""

    last_cycle: str = ""
    last_cycle_start: int | None = None
    last_began_seq: int = 0
    running: tuple[str, ...] = ()
    cycles: int = 0
    last_request_seq: int = 0
    last_request_reason: str = ""
    exchanges: PersistentMap[str, int] = msgspec.field(default_factory=PersistentMap)
    most_exchanges: int = 0
    deltas: PersistentMap[str, WatchCondition] = msgspec.field(default_factory=PersistentMap)
    matched: tuple[str, ...] = ()

    @property
    def requested(self) -> bool:
        """A request came after the last cycle began."""
        return self.last_request_seq > self.last_began_seq


class MaintenanceLedger(Projection[LedgerState]):
    """The fold of maintenance cycles and requests the rule reads (see LedgerState)."""

    name = "maintenance"
    kinds = None  # every event: a change may match an armed delta watch
    version = 2  # 2: forged began ignored, start clamped, running bounded, delta matches

    def initial(self) -> LedgerState:
        return LedgerState()

    def apply(self, state: LedgerState, event: Event) -> LedgerState:
        if event.kind == "maintenance-cycle-began":
            return _began(state, event)
        if event.kind == "maintenance-requested":
            reason = event.payload(CycleRequested).reason
            return replace(state, last_request_seq=event.seq, last_request_reason=reason)
        if event.kind in ENDINGS:
            cycle = event.key.removeprefix("activity:")
            if cycle in state.running:
                return replace(state, running=tuple(c for c in state.running if c != cycle))
            return state
        if event.key.startswith("watch:"):
            return _watch(state, event)
        if state.deltas and not is_machinery(event):
            state = _match(state, event)
        if event.kind == "human-exchange":
            return _exchange(state, event)
        return state


replace = msgspec.structs.replace


def _began(state: LedgerState, event: Event) -> LedgerState:
    if event.key != CYCLES_KEY or event.origin != ORIGIN:
        return state  # not written by maintenance: a forgery or a mistake, never a cycle
    try:
        began = event.payload(CycleBegan)
    except (msgspec.ValidationError, TypeError):
        return state
    return replace(state, last_cycle=began.cycle,
                   last_cycle_start=min(began.cycle_start, event.ts),
                   last_began_seq=event.seq, cycles=state.cycles + 1,
                   running=(*state.running, began.cycle)[-MAX_RUNNING:],
                   exchanges=PersistentMap(), most_exchanges=0, matched=())


def _watch(state: LedgerState, event: Event) -> LedgerState:
    watch = event.key.removeprefix("watch:")
    if event.kind == "watch-armed":
        try:
            spec = event.payload(WatchArmed)
        except (msgspec.ValidationError, TypeError, ValueError):
            return state
        if spec.watch_class != "delta":
            return _drop(state, watch)
        return replace(state, deltas=state.deltas.set(watch, spec.condition),
                       matched=tuple(m for m in state.matched if m != watch))
    if event.kind in ("watch-fired", "watch-satisfied", "watch-disarmed"):
        return _drop(state, watch)
    return state


def _drop(state: LedgerState, watch: str) -> LedgerState:
    if watch not in state.deltas and watch not in state.matched:
        return state
    return replace(state, deltas=state.deltas.delete(watch) if watch in state.deltas
                   else state.deltas, matched=tuple(m for m in state.matched if m != watch))


def _match(state: LedgerState, event: Event) -> LedgerState:
    fresh = [w for w, condition in state.deltas.items()
             if w not in state.matched and condition.matches(event)]
    return replace(state, matched=(*state.matched, *fresh)) if fresh else state


def _exchange(state: LedgerState, event: Event) -> LedgerState:
    if not event.key.startswith("identity:") or not isinstance(event.data, dict) \
            or event.data.get("role", "human") != "human":
        return state
    identity = event.key.removeprefix("identity:")
    count = state.exchanges.get(identity, 0) + 1
    return replace(state, exchanges=state.exchanges.set(identity, count),
                   most_exchanges=max(state.most_exchanges, count))


async def request_cycle(store: EventStore, reason: str, *, origin: str = "agent") -> Event:
    """Ask for a maintenance cycle now (the on-demand trigger): the layer's rule starts one at
    its next tick, unless one is already pending or running. Returns the stored request."""
    draft = EventDraft("maintenance-requested", REQUESTS_KEY,
                       msgspec.to_builtins(CycleRequested(reason=reason)), origin=origin)
    return (await store.append([draft])).events[0]
