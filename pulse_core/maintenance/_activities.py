"""Activities: provenance records of what was done, by whom, from what, to what.

An activity lives on the key `activity:<id>`. It is either recorded whole, in the same
append as the changes it made (`activity-recorded`), or started and later ended
(`activity-started`, then `activity-completed`, `activity-failed` or `activity-cancelled`).
Once ended it never changes: a correction is a new activity naming the one it corrects.

A logical operation that must not run twice (a watch firing, a sweep, a purge) uses its
operation key as the activity id: `perform_once` appends the activity with the expectation
that its key is new, so a second attempt, concurrent or after a crash, finds the stored
outcome ("no effect" included) instead of doing the work again. Within one process,
attempts at the same operation on the same store also wait for each other, so the work
itself runs once (a model call is not made twice); across processes the append's
expectation decides, and the loser's work is discarded unwritten.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec

from pulse_core._errors import InvalidEvent, InvalidTransition, VersionConflict
from pulse_core._events import Event, EventDraft, register_kind
from pulse_core.store import EventStore

T = TypeVar("T")

ACTIVITY_CLASSES = {
    "semantic_consolidation", "procedural_consolidation", "skill_compilation",
    "self_model_refresh", "working_state_refresh", "derivation_review",
    "mnemonic_metabolism", "entity_merge", "human_review", "watch_fire", "action_gate",
    "lifecycle_verdict", "outcome_observation", "retention_review", "archive", "tombstone",
    "purge", "payload_purge", "evidence_correction", "correction", "sleep_task",
    "reviewer_undo", "maintenance_cycle", "legal_hold",
}
"""Known activity classes; `register_activity_class` adds a deployment's own."""

STATUSES = ("running", "completed", "failed", "cancelled")
ENDED = frozenset({"completed", "failed", "cancelled"})
ACTIVITY_KINDS = frozenset({"activity-recorded", "activity-started", "activity-completed",
                            "activity-failed", "activity-cancelled"})


def register_activity_class(name: str) -> None:
    """Make `name` a valid activity class (snake_case)."""
    if not name.replace("_", "").isalnum() or not name.islower():
        raise InvalidEvent(f"activity class {name!r} is not snake_case")
    ACTIVITY_CLASSES.add(name)


class ActivityBody(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of activity-recorded and activity-started."""

    activity_class: str
    status: str = "completed"
    actors: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    started_at: int = 0
    ended_at: int | None = None
    corrects: str | None = None
    report: Any = None

    def __post_init__(self) -> None:
        if self.activity_class not in ACTIVITY_CLASSES:
            raise ValueError(f"activity class {self.activity_class!r} is not registered "
                             f"(known: {', '.join(sorted(ACTIVITY_CLASSES))}) — "
                             "register_activity_class() adds one")
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {', '.join(STATUSES)}")


class ActivityEnd(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of activity-completed, activity-failed and activity-cancelled."""

    ended_at: int
    outputs: tuple[str, ...] = ()
    reason: str = ""
    report: Any = None


register_kind("activity-recorded", "a completed (or failed) activity recorded whole; key: "
              "activity:<id>", ActivityBody)
register_kind("activity-started", "an activity began; key: activity:<id>", ActivityBody)
register_kind("activity-completed", "a started activity completed", ActivityEnd)
register_kind("activity-failed", "a started activity failed: reason says why", ActivityEnd)
register_kind("activity-cancelled", "a started activity was cancelled", ActivityEnd)


class Activity(msgspec.Struct, frozen=True):
    """An activity's current form, folded from its events."""

    id: str
    activity_class: str
    status: str
    actors: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    started_at: int
    ended_at: int | None
    corrects: str | None
    report: Any
    reason: str
    version: int
    seq: int


def activity_key(activity_id: str) -> str:
    """The event key of activity `activity_id`."""
    return f"activity:{activity_id}"


def activity_draft(activity_id: str, body: ActivityBody, *, origin: str,
                   cause: int | None = None) -> EventDraft:
    """The `activity-recorded` (or, with status running, `activity-started`) draft."""
    kind = "activity-started" if body.status == "running" else "activity-recorded"
    return EventDraft(kind, activity_key(activity_id), msgspec.to_builtins(body),
                      origin=origin, cause=cause)


def fold_activity(state: Activity | None, event: Event) -> Activity | None:
    """The activity after `event`; InvalidTransition for a change after it ended."""
    if event.kind in ("activity-recorded", "activity-started"):
        if state is not None:
            raise InvalidTransition(f"activity {event.key!r} already exists ({state.status})")
        body = event.payload(ActivityBody)
        return Activity(event.key.removeprefix("activity:"), body.activity_class,
                        body.status, body.actors, body.inputs, body.outputs, body.started_at,
                        body.ended_at, body.corrects, body.report, "", event.version,
                        event.seq)
    if event.kind not in ACTIVITY_KINDS:
        return state
    if state is None or state.status in ENDED:
        now = "absent" if state is None else state.status
        raise InvalidTransition(f"{event.kind} needs activity {event.key!r} to be running; "
                                f"it is {now} — an ended activity never changes: record a "
                                "correction as a new activity")
    end = event.payload(ActivityEnd)
    status = event.kind.removeprefix("activity-")
    return msgspec.structs.replace(
        state, status=status, ended_at=end.ended_at, outputs=state.outputs + end.outputs,
        report=end.report if end.report is not None else state.report, reason=end.reason,
        version=event.version, seq=event.seq)


async def read_activity(store: EventStore, activity_id: str) -> Activity | None:
    """Activity `activity_id` as the log holds it now, or None."""
    state: Activity | None = None
    for event in await store.read(key=activity_key(activity_id)):
        state = fold_activity(state, event)
    return state


async def end_activity(store: EventStore, activity_id: str, status: str, *, ended_at: int,
                       origin: str, outputs: Sequence[str] = (), reason: str = "",
                       report: Any = None, extra: Sequence[EventDraft] = (),
                       cause: int | None = None) -> Event:
    """End a running activity (status completed, failed or cancelled) with `extra` drafts
    in the same append, the end with cause `cause`; InvalidTransition when it already ended
    or does not exist."""
    if status not in ENDED:
        raise InvalidEvent(f"status {status!r}: an activity ends completed, failed or "
                           "cancelled")
    current = await read_activity(store, activity_id)
    if current is None or current.status in ENDED:
        now = "absent" if current is None else current.status
        raise InvalidTransition(f"activity {activity_id!r} is {now}: only a running "
                                "activity ends — record a correction as a new activity")
    end = EventDraft(f"activity-{status}", activity_key(activity_id), msgspec.to_builtins(
        ActivityEnd(ended_at=ended_at, outputs=tuple(outputs), reason=reason,
                    report=report)), origin=origin, cause=cause)
    result = await store.append([*extra, end],
                                expect={activity_key(activity_id): current.version})
    return result.events[-1]


class Performed(msgspec.Struct, frozen=True):
    """What `perform_once` did: the activity as stored, and whether this call did the work
    (False: an earlier or concurrent attempt did, and this is its stored outcome)."""

    activity: Activity
    ran: bool


async def perform_once(
    store: EventStore,
    operation: str,
    work: Callable[[], Awaitable[tuple[Sequence[EventDraft], ActivityBody,
                                       dict[str, int]]]],
    *,
    origin: str,
    cause: int | None = None,
) -> Performed:
    """Do the logical operation `operation` at most once, ever.

    `work()` reads what it needs and returns the drafts of its changes, the activity that
    records them (its report holds the outcome, "no effect" included) and the expected
    versions the changes rely on. They are appended together (the activity with origin
    `origin` and cause `cause`) with the expectation that the activity `operation` does not
    exist yet. When it already exists its stored outcome is
    returned; when one of the other keys moved, `work()` runs once more on fresh reads
    (`retry_once`), and a second conflict is raised.
    """

    async def attempt() -> Performed:
        done = await read_activity(store, operation)
        if done is not None:
            return Performed(done, ran=False)
        drafts, body, expect = await work()
        record = activity_draft(operation, body, origin=origin, cause=cause)
        try:
            result = await store.append([*drafts, record],
                                        expect={**expect, activity_key(operation): 0})
        except VersionConflict as exc:
            if exc.key != activity_key(operation):
                raise
            done = await read_activity(store, operation)
            assert done is not None  # the key moved: somebody recorded it
            return Performed(done, ran=False)
        stored = fold_activity(None, result.events[-1])
        assert stored is not None
        return Performed(stored, ran=True)

    flight_key = (id(store), id(asyncio.get_running_loop()), operation)
    flight = _flights.setdefault(flight_key, _Flight())
    flight.users += 1
    try:
        async with flight.lock:  # a concurrent attempt here finds the stored outcome
            return await retry_once(attempt)
    finally:
        flight.users -= 1
        if not flight.users:
            del _flights[flight_key]


class _Flight:
    """The attempts at one operation in flight in this process, one at a time."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


_flights: dict[tuple[int, int, str], _Flight] = {}


async def retry_once(attempt: Callable[[], Awaitable[T]]) -> T:
    """`attempt()`; on VersionConflict, once more (it must re-read and re-evaluate: never a
    blind replay of the same writes); a second conflict is raised."""
    try:
        return await attempt()
    except VersionConflict:
        return await attempt()
