"""Watches: declared expectations over the log that turn a change, or a silence, into
attention (seed 004, sections 3.1 and 17).

A delta watch fires on the first committed change that matches its condition; a silence watch
fires when its `due_at` passes with no matching change, decided only once the change cursor
has consumed the log through the seq current at due_at (never on the clock alone), and is
satisfied instead when a match arrives by due_at. A fire is atomic and keyed: one append
holds the `watch-fired` transition (with the watch's expected version), the sleep task it
produces (or nothing, for a wake) and the `watch_fire` activity whose id is
`watch_fire:<id>:<seq>` (silence: `watch_fire:<id>:silence:<due_at>`), so a concurrent cycle
finds the stored activity instead of firing twice. The evaluation tests each change only
against the watches a `WatchIndex` names for it, and can be given a budget of events per call.

A fired watch authorizes nothing: it asks for attention. What is done about it goes through
`decide_watch`, which records the decision (act, ask, defer or silence: silence too) as
`watch-decided` plus an `action_gate` activity, once per fire: a different decision later
raises DecisionConflict instead of vanishing.

The data (payloads, the fold, the Watches projection, `matches`, `WatchIndex`,
`delta_fires`) lives in pulse_core.maintenance._watch_kinds and is re-exported here.

::

    watch-armed ─▶ watch-fired ─▶ watch-decided
         ├──────▶ watch-satisfied     (silence: the change came in time)
         └──────▶ watch-disarmed
    (a watch that is not armed may be armed again)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from pulse_core._clock import SystemClock
from pulse_core._errors import InvalidTransition, VersionConflict
from pulse_core._events import Event, EventDraft
from pulse_core._pmap import PersistentMap
from pulse_core.maintenance._activities import ActivityBody, Performed, perform_once
from pulse_core.maintenance._sleep import SleepTaskCreated, sleep_key, sleep_task_draft
from pulse_core.maintenance._watch_kinds import (
    CLASSES,
    DECISIONS,
    MACHINE_PREFIXES,
    PRODUCES,
    WATCH_KINDS,
    Watch,
    WatchArmed,
    WatchCondition,
    WatchDecided,
    WatchDisarmed,
    Watches,
    WatchFired,
    WatchIndex,
    WatchSatisfied,
    apply_watch_event,
    armed,
    delta_fires,
    fire_operation,
    fold_watch,
    is_machinery,
    matches,
    past_due,
    read_watch,
    watch_key,
)
from pulse_core.store import EventStore

__all__ = [
    "CLASSES", "DECISIONS", "MACHINE_PREFIXES", "PRODUCES", "WATCH_KINDS", "DecisionConflict",
    "Evaluation", "Fire", "Watch", "WatchArmed", "WatchCondition", "WatchDecided",
    "WatchDisarmed", "WatchFired", "WatchIndex", "WatchSatisfied", "Watches",
    "apply_watch_event", "arm_watch", "armed", "decide_watch", "delta_fires", "disarm_watch",
    "evaluate_watches", "fire_operation", "fold_watch", "is_machinery", "matches", "past_due",
    "read_watch", "watch_key",
]


class DecisionConflict(InvalidTransition):
    """A fire was already decided otherwise: `decision` (the stored one) by `by`; `wanted`
    was not recorded. A decision is made once per fire."""

    def __init__(self, watch_id: str, decision: str, by: str, wanted: str) -> None:
        self.watch_id = watch_id
        self.decision = decision
        self.by = by
        self.wanted = wanted
        super().__init__(
            f"decide: watch {watch_id!r}'s fire was already decided {decision!r} by {by!r}; "
            f"{wanted!r} was not recorded — a fire is decided once: act on the stored "
            "decision, or arm the watch again to watch for a new fire")


async def _move(store: EventStore, watch_id: str, kind: str, data: object, origin: str
                ) -> Event:
    current = await read_watch(store, watch_id)
    probe = Event(0, "", kind, watch_key(watch_id), 0, 0, origin, None, "", None, data, None)
    fold_watch(current, probe)
    draft = EventDraft(kind, watch_key(watch_id), data, origin=origin)
    expect = {watch_key(watch_id): current.version if current else 0}
    return (await store.append([draft], expect=expect)).events[0]


async def arm_watch(store: EventStore, watch_id: str, spec: WatchArmed, *, origin: str) -> Event:
    """Arm (or re-arm a watch that is no longer armed); InvalidTransition when armed."""
    return await _move(store, watch_id, "watch-armed", msgspec.to_builtins(spec), origin)


async def disarm_watch(store: EventStore, watch_id: str, *, origin: str, reason: str = ""
                 ) -> Event:
    """Disarm an armed watch; InvalidTransition when it is not armed."""
    return await _move(store, watch_id, "watch-disarmed",
                       msgspec.to_builtins(WatchDisarmed(reason)), origin)


class Fire(msgspec.Struct, frozen=True):
    """A fire this evaluation made: the watch, its operation key, the triggering seq (None
    for silence) and what it produced (a sleep task id, or "wake")."""

    watch_id: str
    operation: str
    trigger_seq: int | None
    produced: str


class Evaluation(msgspec.Struct, frozen=True):
    """What `evaluate_watches` did, and the seq the change cursor has consumed through: keep
    it durable and pass it as `after_seq` next time. `complete` is False when the budget
    (`max_events`) stopped the read before the log's head: evaluate again from
    `consumed_through` (no silence without a match was decided meanwhile)."""

    fired: tuple[Fire, ...]
    satisfied: tuple[str, ...]
    consumed_through: int
    complete: bool = True


async def evaluate_watches(store: EventStore, watches_state: Mapping[str, Watch], after_seq: int,
                           now_ms: int, *, origin: str, page: int = 5_000,
                           max_events: int | None = None,
                           cause: int | None = None) -> Evaluation:
    """Evaluate armed watches against the changes committed after `after_seq`.

    `watches_state` must reflect the log through `after_seq` at least (the Watches
    projection of a snapshot at or after it): watch events among the changes are folded in
    as they are read, so a watch armed meanwhile sees only changes after its arming. Each
    change is tested only against the watches a `WatchIndex` names for it (by kind and key
    prefix), not against every armed watch.

    `max_events` bounds the events read in this call (pages of at most `page`, the last one
    cut to the budget): the read stops at that page boundary, and `consumed_through` says
    where to resume. Delta fires and satisfactions found so far are made; a silence watch
    with no match is fired only once every change up to the log's head at evaluation time
    was consumed (`complete`). A fire another evaluator made first is not reported. What it
    writes has origin `origin` and cause `cause`.
    """
    if page < 1:
        raise ValueError(f"page must be >= 1, not {page}")
    if max_events is not None and max_events < 1:
        raise ValueError(f"max_events must be >= 1 (or None: no budget), not {max_events}")
    state = (watches_state if isinstance(watches_state, PersistentMap)
             else PersistentMap(watches_state))
    index = WatchIndex(w for w in state.values() if w.status == "armed")
    matched: dict[str, Event] = {}
    consumed, read, complete = after_seq, 0, False
    while True:
        limit = page if max_events is None else min(page, max_events - read)
        chunk = await store.read_page(consumed, limit=limit)
        read += len(chunk.events)
        for event in chunk.events:
            if event.kind in WATCH_KINDS:
                before = state.get(event.key.removeprefix("watch:"))
                state = apply_watch_event(state, event)
                after = state.get(event.key.removeprefix("watch:"))
                if after is not None and after is not before:
                    matched.pop(after.id, None)  # a match of an earlier arming is void
                    index.remove(after.id)
                    if after.status == "armed":
                        index.add(after)
                continue
            if is_machinery(event):
                continue
            for watch in index.candidates(event):
                if event.seq > watch.armed_seq and matches(watch.spec.condition, event):
                    matched[watch.id] = event  # the first match decides: stop testing it
                    index.remove(watch.id)
        if len(chunk.events) < limit:
            consumed, complete = max(consumed, chunk.last_seq), True
            break
        consumed = chunk.events[-1].seq
        if max_events is not None and read >= max_events:
            break
    fired: list[Fire] = []
    satisfied: list[str] = []
    for watch in armed(state):
        match = matched.get(watch.id)
        if watch.spec.watch_class == "delta":
            if match is not None:
                done = await _fire(store, watch, match, now_ms, origin, cause=cause)
                fired.extend([done] if done else [])
            continue
        due = watch.spec.due_at
        assert due is not None
        if match is not None and match.ts <= due:
            if await _satisfy(store, watch, match, origin, cause):
                satisfied.append(watch.id)
        elif due <= now_ms and (complete or match is not None):
            done = await _fire(store, watch, None, now_ms, origin, cause=cause)
            fired.extend([done] if done else [])
    return Evaluation(tuple(fired), tuple(satisfied), consumed, complete)


async def _satisfy(store: EventStore, watch: Watch, event: Event, origin: str,
                   cause: int | None) -> bool:
    draft = EventDraft("watch-satisfied", watch_key(watch.id),
                       msgspec.to_builtins(WatchSatisfied(event.seq)), origin=origin,
                       cause=cause)
    try:
        await store.append([draft], expect={watch_key(watch.id): watch.version})
    except VersionConflict:
        return False  # another evaluator decided it first
    return True


async def _fire(store: EventStore, watch: Watch, event: Event | None, now_ms: int,
                origin: str, *, cause: int | None) -> Fire | None:
    trigger = None if event is None else event.seq
    operation = fire_operation(watch, trigger)

    async def work() -> tuple[Sequence[EventDraft], ActivityBody, dict[str, int]]:
        current = await read_watch(store, watch.id)
        inputs = (watch_key(watch.id), *(() if event is None else (f"event:{event.seq}",)))
        if current is None or current.status != "armed" or current.armed_seq != watch.armed_seq:
            now = "absent" if current is None else current.status
            body = ActivityBody(activity_class="watch_fire", actors=(origin,), inputs=inputs,
                                started_at=now_ms, ended_at=now_ms,
                                report={"fired": False, "reason": f"the watch is {now}"})
            return [], body, {}
        spec = current.spec
        produced = "wake" if spec.produces == "wake" else operation
        drafts = [EventDraft("watch-fired", watch_key(watch.id), msgspec.to_builtins(
            WatchFired(trigger, spec.due_at if event is None else None, produced)),
            origin=origin, cause=cause)]
        expect = {watch_key(watch.id): current.version}
        if spec.produces == "sleep-task":
            task = SleepTaskCreated(task_class=spec.task_class, priority=spec.priority,
                                    subject=watch.id, reason=spec.reason or f"watch "
                                    f"{watch.id} fired")
            drafts.append(sleep_task_draft(operation, task, origin=origin, cause=cause))
            expect[sleep_key(operation)] = 0
        body = ActivityBody(activity_class="watch_fire", actors=(origin,), inputs=inputs,
                            outputs=(produced if produced == "wake" else sleep_key(produced),),
                            started_at=now_ms, ended_at=now_ms,
                            report={"fired": True, "produced": produced})
        return drafts, body, expect

    latest = await read_watch(store, watch.id)
    if latest is None or latest.version != watch.version:
        return None  # moved since the state was read: fired, satisfied or disarmed
    try:
        done = await perform_once(store, operation, work, origin=origin, cause=cause)
    except VersionConflict:
        return None  # moved twice under us: the next evaluation sees it settled
    report = done.activity.report
    if not done.ran or not (isinstance(report, dict) and report.get("fired")):
        return None
    return Fire(watch.id, operation, trigger, str(report["produced"]))


def _already(watch: Watch, decision: str) -> None:
    """DecisionConflict when `watch`'s fire was decided other than `decision`."""
    if watch.decision is not None and watch.decision != decision:
        raise DecisionConflict(watch.id, watch.decision, watch.decided_by or "?", decision)


async def decide_watch(store: EventStore, watch_id: str, decision: str, reason: str = "", *,
                       inputs: Sequence[str] = (), origin: str, now_ms: int | None = None
                       ) -> Performed:
    """Record the outward decision after a fire (act, ask, defer or silence) as watch-decided
    plus an `action_gate` activity `action_gate:<fire operation>`, once per fire. The same
    decision again returns the stored one (`ran` False, whatever its reason); another
    decision raises DecisionConflict naming the stored decision and who made it, so a later
    "act" is never silently dropped. `inputs` name what the decision applied (skills,
    memories); the watch is added. InvalidTransition when the watch has not fired, or fired
    again meanwhile."""
    body = WatchDecided(decision, reason, tuple(inputs))
    at = SystemClock().now_ms() if now_ms is None else now_ms
    watch = await read_watch(store, watch_id)
    if watch is None or watch.fired_op is None:
        now = "absent" if watch is None else watch.status
        raise InvalidTransition(f"decide: watch {watch_id!r} is {now} — only a fired watch's "
                                "decision is recorded")
    _already(watch, decision)
    fired_op = watch.fired_op

    async def work() -> tuple[Sequence[EventDraft], ActivityBody, dict[str, int]]:
        current = await read_watch(store, watch_id)
        assert current is not None
        if current.fired_op != fired_op:
            raise InvalidTransition(f"decide: watch {watch_id!r} fired again meanwhile — "
                                    "re-read it and decide its latest fire")
        _already(current, decision)
        # decided by a writer that skipped the gate: record the gate, not a second decision
        drafts = [] if current.decision is not None else [EventDraft(
            "watch-decided", watch_key(watch_id), msgspec.to_builtins(body), origin=origin)]
        activity = ActivityBody(
            activity_class="action_gate", actors=(origin,),
            inputs=(watch_key(watch_id), f"activity:{fired_op}", *inputs),
            started_at=at, ended_at=at,
            report={"decision": decision, "reason": reason, "watch": watch_id,
                    "decided_by": current.decided_by or origin})
        return drafts, activity, {watch_key(watch_id): current.version}

    done = await perform_once(store, f"action_gate:{fired_op}", work, origin=origin)
    report = done.activity.report
    stored = report.get("decision") if isinstance(report, dict) else None
    if stored != decision:  # a concurrent decision won the race
        by = report.get("decided_by") if isinstance(report, dict) else None
        actors = done.activity.actors
        raise DecisionConflict(watch_id, str(stored), str(by or (actors[0] if actors else "?")),
                               decision)
    return done
