"""Watches: declared expectations over the log that turn a change, or a silence, into
attention (seed 004, sections 3.1 and 17).

A delta watch fires on the first committed change that matches its condition; a silence watch
fires when its `due_at` passes with no matching change, decided only once the change cursor
has consumed the log through the seq current at due_at (never on the clock alone), and is
satisfied instead when a match arrives by due_at. A fire is atomic and keyed: one append
holds the `watch-fired` transition (with the watch's expected version), the sleep task it
produces (or nothing, for a wake) and the `watch_fire` activity whose id is
`watch_fire:<id>:<seq>` (silence: `watch_fire:<id>:silence:<due_at>`), so a concurrent cycle
finds the stored activity instead of firing twice.

A fired watch authorizes nothing: it asks for attention. What is done about it goes through
`decide`, which records the decision (act, ask, defer or silence: silence too) as
`watch-decided` plus an `action_gate` activity.

::

    watch-armed ─▶ watch-fired ─▶ watch-decided
         ├──────▶ watch-satisfied     (silence: the change came in time)
         └──────▶ watch-disarmed
    (a watch that is not armed may be armed again)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from pulse_core._activities import ActivityBody, Performed, perform_once
from pulse_core._clock import SystemClock
from pulse_core._errors import InvalidTransition, VersionConflict
from pulse_core._events import Event, EventDraft, register_kind
from pulse_core._pmap import PersistentMap
from pulse_core._sleep import SleepTaskCreated, sleep_key, sleep_task_draft
from pulse_core._snapshot import Projection
from pulse_core.store._base import EventStore

CLASSES = ("delta", "silence")
DECISIONS = ("act", "ask", "defer", "silence")
PRODUCES = ("sleep-task", "wake")
MACHINE_PREFIXES = ("activity:watch_fire:", "activity:action_gate:", "sleep:watch_fire:")
"""Keys of what the watch machinery writes besides watch-* events: never a trigger."""


class WatchCondition(msgspec.Struct, frozen=True, kw_only=True):
    """What a matching change looks like; every field set must match (empty: any)."""

    key_prefix: str = ""
    kinds: tuple[str, ...] = ()
    record: str = ""
    origin_prefix: str = ""

    def matches(self, event: Event) -> bool:
        """Whether `event` matches (the machinery's own events never do: see `is_machinery`)."""
        if is_machinery(event):
            return False
        if not event.key.startswith(self.key_prefix) or (
                self.kinds and event.kind not in self.kinds):
            return False
        if self.record and not (isinstance(event.data, dict)
                                and event.data.get("record") == self.record):
            return False
        return event.origin.startswith(self.origin_prefix)


class WatchArmed(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of watch-armed. A fire produces a sleep task of `task_class` (or a wake)."""

    watch_class: str
    condition: WatchCondition = WatchCondition()
    due_at: int | None = None
    reason: str = ""
    produces: str = "sleep-task"
    task_class: str = "watch_review"
    priority: int = 0

    def __post_init__(self) -> None:
        if self.watch_class not in CLASSES:
            raise ValueError(f"watch_class {self.watch_class!r} is not delta or silence")
        if self.watch_class == "silence" and self.due_at is None:
            raise ValueError("a silence watch needs due_at (ms): the time by which the "
                             "change is expected")
        if self.produces not in PRODUCES:
            raise ValueError(f"produces {self.produces!r} is not sleep-task or wake")


class WatchFired(msgspec.Struct, frozen=True):
    """Payload of watch-fired: the matching change (None for silence), the due time (for
    silence), and what it produced: a sleep task id, or "wake"."""

    trigger_seq: int | None
    due_at: int | None
    produced: str


class WatchSatisfied(msgspec.Struct, frozen=True):
    """Payload of watch-satisfied: the change that came by due_at."""

    trigger_seq: int


class WatchDisarmed(msgspec.Struct, frozen=True):
    """Payload of watch-disarmed."""

    reason: str = ""


class WatchDecided(msgspec.Struct, frozen=True):
    """Payload of watch-decided: the outward decision after a fire, and what it applied."""

    decision: str
    reason: str = ""
    inputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise ValueError(f"decision {self.decision!r} is not one of {', '.join(DECISIONS)}")


register_kind("watch-armed", "a delta or silence watch was armed; key: watch:<id>", WatchArmed)
register_kind("watch-fired", "a watch fired: it produced a sleep task or a wake, and "
              "authorizes nothing", WatchFired)
register_kind("watch-satisfied", "a silence watch's change arrived by due_at: no fire",
              WatchSatisfied)
register_kind("watch-disarmed", "a watch was disarmed before it fired", WatchDisarmed)
register_kind("watch-decided", "the decision after a fire (act, ask, defer or silence), "
              "recorded whatever it is", WatchDecided)

WATCH_KINDS = frozenset({"watch-armed", "watch-fired", "watch-satisfied", "watch-disarmed",
                         "watch-decided"})


def is_machinery(event: Event) -> bool:
    """Whether `event` was written by the watch machinery itself (so it never triggers)."""
    return event.kind in WATCH_KINDS or event.key.startswith(MACHINE_PREFIXES)


class Watch(msgspec.Struct, frozen=True, gc=False):
    """A watch's current form. `status`: armed, fired, satisfied or disarmed; `fired_op` is
    the operation key of its latest fire, `decision` what was decided after it."""

    id: str
    spec: WatchArmed
    status: str
    version: int
    armed_at: int
    armed_seq: int
    trigger_seq: int | None = None
    produced: str | None = None
    fired_op: str | None = None
    decision: str | None = None


def watch_key(watch_id: str) -> str:
    """The event key of watch `watch_id`."""
    return f"watch:{watch_id}"


def fire_operation(watch: Watch, trigger_seq: int | None) -> str:
    """The operation (and activity) key of a fire: watch_fire:<id>:<seq> for a delta,
    watch_fire:<id>:silence:<due_at> for a silence."""
    if watch.spec.watch_class == "silence":
        return f"watch_fire:{watch.id}:silence:{watch.spec.due_at}"
    return f"watch_fire:{watch.id}:{trigger_seq}"


def fold_watch(state: Watch | None, event: Event) -> Watch | None:
    """The watch after `event`; InvalidTransition when its status does not allow it."""
    watch_id = event.key.removeprefix("watch:")
    if event.kind == "watch-armed":
        if state is not None and state.status == "armed":
            raise InvalidTransition(f"watch {watch_id!r} is already armed — disarm it first")
        return Watch(watch_id, event.payload(WatchArmed), "armed", event.version, event.ts,
                     event.seq)
    if event.kind not in WATCH_KINDS:
        return state
    if state is None:
        raise InvalidTransition(f"{event.kind}: there is no watch {watch_id!r}")
    if event.kind == "watch-decided":
        if state.status != "fired" or state.decision is not None:
            raise InvalidTransition(f"watch-decided: watch {watch_id!r} is {state.status}"
                                    f"{', already decided' if state.decision else ''} — a "
                                    "decision follows a fire, once")
        return msgspec.structs.replace(state, decision=event.payload(WatchDecided).decision,
                                       version=event.version)
    if state.status != "armed":
        raise InvalidTransition(f"{event.kind}: watch {watch_id!r} is {state.status}, not "
                                "armed — arm it again to watch anew")
    if event.kind == "watch-fired":
        body = event.payload(WatchFired)
        op = fire_operation(state, body.trigger_seq)
        return msgspec.structs.replace(state, status="fired", trigger_seq=body.trigger_seq,
                                       produced=body.produced, fired_op=op,
                                       version=event.version)
    if event.kind == "watch-satisfied":
        return msgspec.structs.replace(
            state, status="satisfied", trigger_seq=event.payload(WatchSatisfied).trigger_seq,
            version=event.version)
    return msgspec.structs.replace(state, status="disarmed", version=event.version)


def _apply(state: PersistentMap[str, Watch], event: Event) -> PersistentMap[str, Watch]:
    if not event.key.startswith("watch:"):
        return state
    watch_id = event.key.removeprefix("watch:")
    current = state.get(watch_id)
    if current is not None and event.version <= current.version:
        return state  # already folded
    try:
        watch = fold_watch(current, event)
    except InvalidTransition:
        return state  # written by a writer that skipped the checks; ignore
    return state if watch is None else state.set(watch_id, watch)


class Watches(Projection[PersistentMap[str, Watch]]):
    """Every watch by id (Watch)."""

    name = "watches"
    kinds = WATCH_KINDS

    def initial(self) -> PersistentMap[str, Watch]:
        return PersistentMap()

    def apply(self, state: PersistentMap[str, Watch], event: Event
              ) -> PersistentMap[str, Watch]:
        return _apply(state, event)


def armed(watches: Mapping[str, Watch]) -> list[Watch]:
    """Armed watches, soonest due first (delta watches, which have no due time, last)."""
    found = [w for w in watches.values() if w.status == "armed"]
    found.sort(key=lambda w: (w.spec.due_at is None, w.spec.due_at or 0, w.armed_seq))
    return found


def past_due(watches: Mapping[str, Watch], now_ms: int) -> list[Watch]:
    """Armed silence watches whose due_at has passed: the next evaluation decides them."""
    return [w for w in armed(watches) if w.spec.due_at is not None and w.spec.due_at <= now_ms]


async def read_watch(store: EventStore, watch_id: str) -> Watch | None:
    """Watch `watch_id` as the log holds it now, or None."""
    state: PersistentMap[str, Watch] = PersistentMap()
    for event in await store.read(key=watch_key(watch_id), kinds=WATCH_KINDS):
        state = _apply(state, event)
    return state.get(watch_id)


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
    """What `evaluate` did, and the seq the change cursor has consumed through: keep it
    durable and pass it as `after_seq` next time."""

    fired: tuple[Fire, ...]
    satisfied: tuple[str, ...]
    consumed_through: int


async def evaluate_watches(store: EventStore, watches_state: Mapping[str, Watch], after_seq: int,
                   now_ms: int, *, origin: str, page: int = 5_000) -> Evaluation:
    """Evaluate armed watches against the changes committed after `after_seq`.

    `watches_state` must reflect the log through `after_seq` at least (the Watches
    projection of a snapshot at or after it): watch events among the changes are folded in
    as they are read, so a watch armed meanwhile sees only changes after its arming. Every
    change up to the log's head at evaluation time is consumed before any silence is
    decided. A fire another evaluator made first is not reported.
    """
    state = (watches_state if isinstance(watches_state, PersistentMap)
             else PersistentMap(watches_state))
    matched: dict[str, Event] = {}
    consumed = after_seq
    async for chunk in store.pages(after_seq, limit=page):
        consumed = max(consumed, chunk.last_seq)
        for event in chunk.events:
            if event.kind in WATCH_KINDS:
                state = _apply(state, event)
                continue
            for watch in state.values():
                if (watch.status == "armed" and watch.id not in matched
                        and event.seq > watch.armed_seq and watch.spec.condition.matches(event)):
                    matched[watch.id] = event
    fired: list[Fire] = []
    satisfied: list[str] = []
    for watch in armed(state):
        match = matched.get(watch.id)
        if watch.spec.watch_class == "delta":
            if match is not None:
                done = await _fire(store, watch, match, now_ms, origin)
                fired.extend([done] if done else [])
            continue
        due = watch.spec.due_at
        assert due is not None
        if match is not None and match.ts <= due:
            if await _satisfy(store, watch, match, origin):
                satisfied.append(watch.id)
        elif due <= now_ms:
            done = await _fire(store, watch, None, now_ms, origin)
            fired.extend([done] if done else [])
    return Evaluation(tuple(fired), tuple(satisfied), consumed)


async def _satisfy(store: EventStore, watch: Watch, event: Event, origin: str) -> bool:
    draft = EventDraft("watch-satisfied", watch_key(watch.id),
                       msgspec.to_builtins(WatchSatisfied(event.seq)), origin=origin)
    try:
        await store.append([draft], expect={watch_key(watch.id): watch.version})
    except VersionConflict:
        return False  # another evaluator decided it first
    return True


async def _fire(store: EventStore, watch: Watch, event: Event | None, now_ms: int,
                origin: str) -> Fire | None:
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
            origin=origin)]
        expect = {watch_key(watch.id): current.version}
        if spec.produces == "sleep-task":
            task = SleepTaskCreated(task_class=spec.task_class, priority=spec.priority,
                                    subject=watch.id, reason=spec.reason or f"watch "
                                    f"{watch.id} fired")
            drafts.append(sleep_task_draft(operation, task, origin=origin))
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
        done = await perform_once(store, operation, work, origin=origin)
    except VersionConflict:
        return None  # moved twice under us: the next evaluation sees it settled
    report = done.activity.report
    if not done.ran or not (isinstance(report, dict) and report.get("fired")):
        return None
    return Fire(watch.id, operation, trigger, str(report["produced"]))


async def decide_watch(store: EventStore, watch_id: str, decision: str, reason: str = "", *,
                 inputs: Sequence[str] = (), origin: str, now_ms: int | None = None
                 ) -> Performed:
    """Record the outward decision after a fire (act, ask, defer or silence) as watch-decided
    plus an `action_gate` activity `action_gate:<fire operation>`, once per fire: a repeat
    returns the stored one. `inputs` name what the decision applied (skills, memories); the
    watch is added. InvalidTransition when the watch has not fired."""
    body = WatchDecided(decision, reason, tuple(inputs))
    at = SystemClock().now_ms() if now_ms is None else now_ms
    watch = await read_watch(store, watch_id)
    if watch is None or watch.fired_op is None:
        now = "absent" if watch is None else watch.status
        raise InvalidTransition(f"decide: watch {watch_id!r} is {now} — only a fired watch's "
                                "decision is recorded")
    fired_op = watch.fired_op

    async def work() -> tuple[Sequence[EventDraft], ActivityBody, dict[str, int]]:
        current = await read_watch(store, watch_id)
        assert current is not None
        if current.fired_op != fired_op or current.decision is not None:
            raise InvalidTransition(f"decide: watch {watch_id!r} was decided or fired again "
                                    "meanwhile — re-read it")
        draft = EventDraft("watch-decided", watch_key(watch_id), msgspec.to_builtins(body),
                           origin=origin)
        activity = ActivityBody(
            activity_class="action_gate", actors=(origin,),
            inputs=(watch_key(watch_id), f"activity:{fired_op}", *inputs),
            started_at=at, ended_at=at,
            report={"decision": decision, "reason": reason, "watch": watch_id})
        return [draft], activity, {watch_key(watch_id): current.version}

    return await perform_once(store, f"action_gate:{fired_op}", work, origin=origin)
