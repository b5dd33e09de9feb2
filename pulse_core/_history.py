"""Why an event is in the log: the chain its `cause` fields lead back along (a claim or an
outcome to its effect, an operator's retry to the effect), and the tick that decided it: a
tick records its effects, marks and errors and its own `tick` event in one append, so the
tick of an event is the `tick` of the same transaction."""

from __future__ import annotations

import msgspec

from pulse_core._events import Event
from pulse_core.store import EventStore

CAUSE_DEPTH = 10
"""How many causes back a chain is followed."""
TICK_WRITTEN = frozenset({"effect", "mark", "error"})
"""The kinds a tick records beside its `tick` event."""


class Causes(msgspec.Struct, frozen=True):
    """Why an event is in the log: `chain`, the events its cause leads back to, nearest
    first (at most CAUSE_DEPTH); `missing`, the seq of a cause that cannot be read, where the
    chain stops; `tick`, the `tick` event of the tick that decided the event or the nearest
    of its causes a tick recorded (None when no tick did)."""

    chain: list[Event]
    missing: int | None = None
    tick: Event | None = None


async def event_at(store: EventStore, seq: int) -> Event | None:
    """The stored event `seq` (None when there is none, or it is quarantined)."""
    found = await store.read(seq - 1, limit=1) if 0 < seq < 2**63 else []
    return found[0] if found and found[0].seq == seq else None


async def tick_of(store: EventStore, event: Event) -> Event | None:
    """The `tick` event recorded in the same append as `event` (None when a tick did not
    record it)."""
    if event.kind not in TICK_WRITTEN:
        return None
    found = await store.read(event.seq, kinds=["tick"], limit=1)
    return found[0] if found and found[0].tx == event.tx else None


async def causes_of(store: EventStore, event: Event, depth: int = CAUSE_DEPTH) -> Causes:
    """The Causes of `event` in `store`: its cause chain up to the first event a tick
    recorded (that event's own cause is only the newest event its tick had seen, so the
    chain ends there, with that tick)."""
    chain: list[Event] = []
    current = event
    while True:
        tick = await tick_of(store, current)
        if tick is not None:
            return Causes(chain, None, tick)
        if current.cause is None or len(chain) >= depth:
            return Causes(chain)
        found = await event_at(store, current.cause)
        if found is None:
            return Causes(chain, current.cause)
        chain.append(found)
        current = found
