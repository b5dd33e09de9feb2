"""Undo a whole accepted reviewer cycle: compensating events, never an erased history.

An accepted cycle wrote its verb events (`state-revised`, `state-retracted`,
`unresolved-resolved`) in the same append, so the same transaction (`tx`), as its
`awareness-cycle` record. `undo_cycle` folds the identity's memory as it was just before
that append and writes, in one append guarded by the identity key's expected version, the
events that put back each item the cycle changed (the old value or confidence, a retracted
item set again, a resolved item opened again under its record id) and a `reviewer_undo`
activity naming the cycle and its events. The cycle and its events stay in the log.

It is refused, with nothing written, when the cycle does not exist, changed nothing, or
when an item it changed was written again since (by anyone, the reviewer included): the undo
would then overwrite a newer word. A later cycle that was itself undone does not count: its
writes and their compensations cancel out, so cycles can be undone newest first. Undoing
twice is idempotent: the second call writes nothing and returns the first undo's activity
event.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pulse_adapters.awareness.ledger import CycleRecord
from pulse_core import Clock, Event, EventDraft, PulseError, SystemClock
from pulse_core.maintenance import ActivityBody, perform_once, read_activity
from pulse_core.memory import IdentityMemory, StateRevised, identity_key, remember
from pulse_core.store import EventStore

VERB_KINDS = frozenset({"state-revised", "state-retracted", "unresolved-resolved"})
"""The kinds a reviewer cycle writes for its accepted verbs."""
_STATE_WRITES = frozenset({"state-set", "state-revised", "state-retracted"})
_UNRESOLVED_WRITES = frozenset({"unresolved-opened", "unresolved-resolved"})
_REMOVALS = frozenset({"record-forgotten", "record-quarantined", "element-purged"})
_COMPENSATIONS = frozenset({"state-revised", "state-set", "unresolved-opened"})


class UndoRefused(PulseError):
    """An undo of a reviewer cycle that cannot be done; nothing was written."""


class CycleNotFound(UndoRefused):
    """No awareness-cycle of that identity has that seq or event id."""


class NothingToUndo(UndoRefused):
    """The cycle changed nothing (it failed, or the gate accepted no verb)."""


class UndoConflict(UndoRefused):
    """An item the cycle changed was written again since: undoing would overwrite it."""


def undo_id(identity: str, cycle_seq: int) -> str:
    """The activity id (and operation key) of the undo of cycle `cycle_seq`."""
    return f"reviewer_undo:{identity}:{cycle_seq}"


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


async def _find_cycle(store: EventStore, identity: str, cycle_id: int | str) -> Event:
    key = identity_key(identity)
    if isinstance(cycle_id, int):
        found = [e for e in await store.read(max(cycle_id - 1, 0), limit=1)
                 if e.seq == cycle_id]
    else:
        found = [e for e in await store.read(key=key, kinds=["awareness-cycle"])
                 if e.id == cycle_id]
    if not found or found[0].kind != "awareness-cycle" or found[0].key != key:
        raise CycleNotFound(
            f"there is no awareness-cycle {cycle_id!r} of identity {identity!r} — name a "
            "cycle by its event's seq or id (read kinds=['awareness-cycle'] on "
            f"{key!r})")
    return found[0]


def _target(event: Event) -> tuple[str, str]:
    record = str(event.data.get("record", "")) if isinstance(event.data, dict) else ""
    kind = "unresolved" if event.kind in _UNRESOLVED_WRITES else "state"
    return f"{kind}:{record}", record


def _written_since(event: Event, later: Sequence[Event]) -> Event | None:
    """The first event after the cycle that wrote the item `event` changed."""
    target, record = _target(event)
    writes = _UNRESOLVED_WRITES if target.startswith("unresolved:") else _STATE_WRITES
    for other in later:
        data = other.data if isinstance(other.data, dict) else {}
        if data.get("record") == record and (other.kind in writes or other.kind in _REMOVALS):
            return other
    return None


def _compensation(event: Event, before: IdentityMemory, origin: str, reason: str
                  ) -> EventDraft | None:
    """The draft that puts back what `event` changed, or None if it changed nothing."""
    _, record = _target(event)
    key = identity_key(before.identity)
    data: dict[str, Any] = {"record": record, "reason": reason}
    if event.kind == "unresolved-resolved":
        open_item = before.unresolved.get(record)
        if open_item is None:
            return None
        data |= {"text": open_item.text, "priority": open_item.priority}
        return EventDraft("unresolved-opened", key, data, origin=origin, cause=event.seq)
    item = before.state.get(record)
    if item is None:
        return None
    if event.kind == "state-retracted":
        data |= {"value": item.value, "confidence": item.confidence,
                 "protected": item.protected, "immutable": list(item.immutable)}
        return EventDraft("state-set", key, data, origin=origin, cause=event.seq)
    revised = event.payload(StateRevised)
    if revised.value_changed:
        data |= {"value": item.value, "value_changed": True}
    if revised.confidence is not None:
        data["confidence"] = item.confidence
    if len(data) == 2:
        return None
    return EventDraft("state-revised", key, data, origin=origin, cause=event.seq)


async def _undone_since(store: EventStore, events: Sequence[Event], cycle: Event
                        ) -> frozenset[int]:
    """The seqs of later cycles' verb events that were undone, and of their compensations:
    pairs that cancel out, so an older cycle can be undone after the newer ones were."""
    identity = cycle.key.removeprefix("identity:")
    paired: set[int] = set()
    for later in events:
        if later.kind != "awareness-cycle" or later.seq <= cycle.seq:
            continue
        undo = await read_activity(store, undo_id(identity, later.seq))
        if undo is None:
            continue
        verbs = {e.seq for e in events
                 if e.tx == later.tx and e.kind in VERB_KINDS and e.seq < later.seq}
        paired |= verbs
        paired |= {e.seq for e in events if e.cause in verbs and e.kind in _COMPENSATIONS
                   and undo.seq - len(verbs) <= e.seq < undo.seq}
    return frozenset(paired)


def _plan(events: Sequence[Event], cycle: Event, *, origin: str, reason: str, now: int,
          paired: frozenset[int] = frozenset()
          ) -> tuple[list[EventDraft], ActivityBody, dict[str, int]]:
    """The compensating drafts, the activity and the expected version, from the identity's
    events as they are now (`paired`: later writes that cancel out); UndoRefused when the
    undo must not happen."""
    identity = cycle.key.removeprefix("identity:")
    record = cycle.payload(CycleRecord)
    same_tx = [e for e in events if e.tx == cycle.tx]
    verbs = [e for e in same_tx if e.kind in VERB_KINDS and e.seq < cycle.seq]
    nothing = NothingToUndo(
        f"awareness cycle #{cycle.seq} of {identity!r} changed nothing (outcome "
        f"{record.outcome!r}, {len(record.accepted)} accepted verbs): there is nothing to "
        "undo")
    if record.outcome != "reviewed" or not verbs:
        raise nothing
    first, last = min(e.seq for e in same_tx), max(e.seq for e in same_tx)
    before: IdentityMemory = IdentityMemory(identity)
    for event in events:
        if event.seq >= first:
            break
        before = remember(before, event)
    later = [e for e in events if e.seq > last and e.seq not in paired]
    drafts: list[EventDraft] = []
    restored: list[str] = []
    for verb in verbs:
        target, item = _target(verb)
        since = _written_since(verb, later)
        if since is not None:
            raise UndoConflict(
                f"{target} was written again since cycle #{cycle.seq} ({since.kind} by "
                f"{since.origin} at {_when(since.ts)}, event #{since.seq}): undoing the "
                "cycle would overwrite that newer write, so nothing was written — change "
                f"{target} directly instead")
        draft = _compensation(verb, before, origin, reason)
        if draft is not None:
            drafts.append(draft)
            restored.append(f"{identity}/{item}")
    if not drafts:
        raise nothing
    body = ActivityBody(
        activity_class="reviewer_undo", actors=(origin,),
        inputs=(f"event:{cycle.seq}", *(f"event:{v.seq}" for v in verbs)),
        outputs=tuple(restored), started_at=now, ended_at=now,
        report={"cycle": cycle.seq, "identity": identity, "reason": reason,
                "restored": [_target(v)[0] for v in verbs]})
    return drafts, body, {identity_key(identity): events[-1].version}


async def undo_cycle(store: EventStore, identity: str, cycle_id: int | str, *, origin: str,
                     reason: str = "", clock: Clock | None = None) -> Event:
    """Undo the accepted awareness cycle `cycle_id` (its event's seq or id) of `identity`.

    Returns the `activity-recorded` event of the `reviewer_undo` activity, written in the
    same append as the compensating events (origin `origin`, cause: the verb event each one
    undoes). A second undo of the same cycle returns the first one's event and writes
    nothing. UndoRefused (CycleNotFound, NothingToUndo, UndoConflict) otherwise, with
    nothing written; a write to the identity between the read and the append makes the undo
    re-read and re-evaluate once (VersionConflict if it moves again)."""
    cycle = await _find_cycle(store, identity, cycle_id)
    now = (clock or SystemClock()).now_ms()

    async def work() -> tuple[list[EventDraft], ActivityBody, dict[str, int]]:
        events = await store.read(key=identity_key(identity))
        paired = await _undone_since(store, events, cycle)
        return _plan(events, cycle, origin=origin, reason=reason, now=now, paired=paired)

    done = await perform_once(store, undo_id(identity, cycle.seq), work, origin=origin)
    (event,) = await store.read(done.activity.seq - 1, limit=1)
    return event

