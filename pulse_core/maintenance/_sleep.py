"""Sleep tasks: background cognitive work (consolidate, review a watch, re-verdict a skill)
described as events, claimed with the task's expected version so two workers never both run it.

::

    sleep-task-created ─▶ sleep-task-claimed ─▶ sleep-task-completed
                               │    ▲   └────▶ sleep-task-failed
                               └────┘ (lease expired: claimable again)

A task lives on the key `sleep:<id>`. A claim is a lease (`until`, ms): while it holds, no
other worker can claim the task; once it expires the task is claimable again. Completed and
failed tasks are final and stay visible, a failure with its reason. `assigned_to` is a label
for whom the work is meant: it authorizes nothing (seed 004, section 8).

Numbers are bounded so a hostile event is refused at append: a priority is an int in
-MAX_PRIORITY..MAX_PRIORITY, a lease's `until` a time in 0..MAX_MS, a lease at most
MAX_LEASE_MS long.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from pulse_core._clock import Clock, SystemClock
from pulse_core._errors import InvalidTransition, VersionConflict
from pulse_core._events import QUARANTINED, Event, EventDraft, register_kind, uuid7
from pulse_core._pmap import PersistentMap
from pulse_core._snapshot import Projection
from pulse_core.maintenance._schedules import check_ms
from pulse_core.store import EventStore

MAX_PRIORITY = 1_000_000
"""Priorities are ints in -MAX_PRIORITY..MAX_PRIORITY (higher: claimed first)."""
MAX_LEASE_MS = 30 * 24 * 3_600_000
"""The longest lease a claim may take: 30 days."""


def check_priority(priority: int) -> int:
    """`priority` when it is in -MAX_PRIORITY..MAX_PRIORITY; ValueError otherwise."""
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority {priority} is out of range: use an int from "
                         f"{-MAX_PRIORITY} to {MAX_PRIORITY}")
    return priority


class SleepTaskCreated(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of sleep-task-created. `subject` names what the work is about (an element id,
    a watch id); `assigned_to` is a label, never a permission."""

    task_class: str
    priority: int = 0
    subject: str = ""
    reason: str = ""
    assigned_to: str = ""

    def __post_init__(self) -> None:
        check_priority(self.priority)


class SleepTaskClaimed(msgspec.Struct, frozen=True):
    """Payload of sleep-task-claimed: worker `by` holds the task until `until` (ms)."""

    by: str
    until: int

    def __post_init__(self) -> None:
        check_ms(self.until, "until")


class SleepTaskCompleted(msgspec.Struct, frozen=True):
    """Payload of sleep-task-completed: the claimer's outcome (any JSON)."""

    by: str
    outcome: Any = None


class SleepTaskFailed(msgspec.Struct, frozen=True):
    """Payload of sleep-task-failed: why the claimer could not do the work."""

    by: str
    reason: str


register_kind("sleep-task-created", "a sleep task (background cognitive work) was created; "
              "key: sleep:<id>", SleepTaskCreated)
register_kind("sleep-task-claimed", "a worker leased a sleep task until `until` (ms)",
              SleepTaskClaimed)
register_kind("sleep-task-completed", "the claimer completed a sleep task with an outcome",
              SleepTaskCompleted)
register_kind("sleep-task-failed", "the claimer failed a sleep task; it stays visible with "
              "the reason", SleepTaskFailed)

SLEEP_KINDS = frozenset({"sleep-task-created", "sleep-task-claimed", "sleep-task-completed",
                         "sleep-task-failed"})
FINAL = frozenset({"completed", "failed"})


class SleepTask(msgspec.Struct, frozen=True, gc=False):
    """A sleep task's current form. `status`: pending, running, completed or failed."""

    id: str
    task_class: str
    priority: int
    subject: str
    reason: str
    assigned_to: str
    status: str
    version: int
    created_at: int
    created_seq: int
    claimed_by: str | None = None
    lease_until: int | None = None
    outcome: Any = None
    failure: str | None = None
    finished_at: int | None = None

    def claimable(self, now_ms: int) -> bool:
        """Pending, or running under a lease that has expired by `now_ms`."""
        return self.status == "pending" or (
            self.status == "running" and (self.lease_until or 0) <= now_ms)


def sleep_key(task_id: str) -> str:
    """The event key of sleep task `task_id`."""
    return f"sleep:{task_id}"


def sleep_task_draft(task_id: str, body: SleepTaskCreated, *, origin: str,
                     idem: str | None = None, cause: int | None = None) -> EventDraft:
    """The sleep-task-created draft (append it expecting version 0 of its key)."""
    return EventDraft("sleep-task-created", sleep_key(task_id), msgspec.to_builtins(body),
                      origin=origin, idem=idem, cause=cause)


def fold_sleep_task(state: SleepTask | None, event: Event) -> SleepTask | None:
    """The task after `event`; InvalidTransition when its status does not allow it.

    A claim of a running task is a re-claim: the writer's expected version is what made it
    exclusive, so the fold does not second-guess the lease."""
    task_id = event.key.removeprefix("sleep:")
    if event.kind == "sleep-task-created":
        if state is not None:
            raise InvalidTransition(f"sleep task {task_id!r} already exists ({state.status})")
        body = event.payload(SleepTaskCreated)
        return SleepTask(task_id, body.task_class, body.priority, body.subject, body.reason,
                         body.assigned_to, "pending", event.version, event.ts, event.seq)
    if event.kind == QUARANTINED:
        return None if state is None else msgspec.structs.replace(state, version=event.version)
    if event.kind not in SLEEP_KINDS:
        return state
    if state is None or state.status in FINAL:
        now = "absent" if state is None else state.status
        raise InvalidTransition(f"{event.kind}: sleep task {task_id!r} is {now} — a completed "
                                "or failed task is final; create a new task for new work")
    if event.kind == "sleep-task-claimed":
        claim = event.payload(SleepTaskClaimed)
        return msgspec.structs.replace(state, status="running", claimed_by=claim.by,
                                       lease_until=claim.until, version=event.version)
    if state.status != "running":
        raise InvalidTransition(f"{event.kind}: sleep task {task_id!r} is pending — claim "
                                "it first")
    if event.kind == "sleep-task-completed":
        done = event.payload(SleepTaskCompleted)
        return msgspec.structs.replace(state, status="completed", outcome=done.outcome,
                                       finished_at=event.ts, version=event.version)
    failed = event.payload(SleepTaskFailed)
    return msgspec.structs.replace(state, status="failed", failure=failed.reason,
                                   finished_at=event.ts, version=event.version)


class SleepTasks(Projection[PersistentMap[str, SleepTask]]):
    """Every sleep task by id (SleepTask), failed ones included."""

    name = "sleep-tasks"
    kinds = SLEEP_KINDS | {QUARANTINED}

    def initial(self) -> PersistentMap[str, SleepTask]:
        return PersistentMap()

    def apply(self, state: PersistentMap[str, SleepTask], event: Event
              ) -> PersistentMap[str, SleepTask]:
        if not event.key.startswith("sleep:"):
            return state
        task_id = event.key.removeprefix("sleep:")
        try:
            task = fold_sleep_task(state.get(task_id), event)
        except InvalidTransition:
            return state  # written by a writer that skipped the board's checks; ignore
        return state if task is None else state.set(task_id, task)


def claimable(tasks: Mapping[str, SleepTask], now_ms: int, *,
              assigned_to: str | None = None, limit: int | None = None
              ) -> list[SleepTask]:
    """Tasks a worker may claim now, highest priority first, then oldest (created seq):
    pending ones and running ones whose lease expired. `assigned_to` filters by the label."""
    found = [t for t in tasks.values() if t.claimable(now_ms)
             and (assigned_to is None or t.assigned_to == assigned_to)]
    found.sort(key=lambda t: (-t.priority, t.created_seq))
    return found if limit is None else found[:limit]


def sleep_task_counts(tasks: Iterable[SleepTask]) -> dict[str, int]:
    """How many tasks are in each status."""
    out: dict[str, int] = {}
    for task in tasks:
        out[task.status] = out.get(task.status, 0) + 1
    return out


class SleepBoard:
    """Creates, claims, completes and fails sleep tasks, each move appended with the task's
    expected version. `clock` decides when a lease has expired (the store's clock in tests);
    every event it writes has origin `origin` and cause `cause`."""

    def __init__(self, store: EventStore, origin: str, *, clock: Clock | None = None,
                 cause: int | None = None) -> None:
        self.store = store
        self.origin = origin
        self.clock = clock or SystemClock()
        self.cause = cause

    async def state(self, task_id: str) -> SleepTask | None:
        """The task as its events say now (None if it does not exist)."""
        task: SleepTask | None = None
        for event in await self.store.read(key=sleep_key(task_id)):
            task = fold_sleep_task(task, event)
        return task

    async def create(self, task_class: str, *, task_id: str | None = None, priority: int = 0,
                     subject: str = "", reason: str = "", assigned_to: str = "",
                     idem: str | None = None) -> SleepTask:
        """Create a task and return it. With `idem` the same logical task is created once:
        its id is derived from `idem`, and a repeat returns the task as it is now
        (IdempotencyConflict if the repeat describes other work). VersionConflict if
        `task_id` is already taken."""
        if task_id is None:
            task_id = (uuid7() if idem is None
                       else "t-" + hashlib.sha256(idem.encode()).hexdigest()[:20])
        body = SleepTaskCreated(task_class=task_class, priority=priority, subject=subject,
                                reason=reason, assigned_to=assigned_to)
        draft = sleep_task_draft(task_id, body, origin=self.origin, idem=idem, cause=self.cause)
        await self.store.append([draft], expect={sleep_key(task_id): 0})
        task = await self.state(task_id)
        assert task is not None
        return task

    async def claim(self, task_id: str, by: str, lease_ms: int) -> SleepTask | None:
        """Lease the task to `by` for `lease_ms`, or None when it is not claimable: another
        worker holds a live lease, it is finished, or another claim won the race (move on to
        the next task). `by` renewing its own live lease succeeds. InvalidTransition for a
        task that does not exist."""
        if not 0 < lease_ms <= MAX_LEASE_MS:
            raise ValueError(f"lease_ms must be in 1..{MAX_LEASE_MS} (30 days), not {lease_ms}")
        task = await self.state(task_id)
        if task is None:
            raise InvalidTransition(f"there is no sleep task {task_id!r} to claim")
        now = self.clock.now_ms()
        if task.status in FINAL or not (task.claimable(now) or task.claimed_by == by):
            return None
        draft = EventDraft("sleep-task-claimed", sleep_key(task_id),
                           msgspec.to_builtins(SleepTaskClaimed(by, now + lease_ms)),
                           origin=self.origin, cause=self.cause)
        try:
            await self.store.append([draft], expect={sleep_key(task_id): task.version})
        except VersionConflict:
            return None  # another worker moved it first
        return await self.state(task_id)

    async def complete(self, task_id: str, by: str, outcome: Any = None) -> SleepTask:
        """Record `by`'s outcome; only the current claimer may. InvalidTransition for a task
        that is not running under `by`'s claim; VersionConflict if it moved meanwhile."""
        body = msgspec.to_builtins(SleepTaskCompleted(by, outcome))
        return await self._finish(task_id, by, "sleep-task-completed", body)

    async def fail(self, task_id: str, by: str, reason: str) -> SleepTask:
        """Record why `by` could not do the task; it stays visible, status failed."""
        body = msgspec.to_builtins(SleepTaskFailed(by, reason))
        return await self._finish(task_id, by, "sleep-task-failed", body)

    async def _finish(self, task_id: str, by: str, kind: str, body: Any) -> SleepTask:
        task = await self.state(task_id)
        if task is None or task.status != "running" or task.claimed_by != by:
            now = ("absent" if task is None else task.status if task.status != "running"
                   else f"claimed by {task.claimed_by!r}")
            raise InvalidTransition(f"{kind}: sleep task {task_id!r} is {now}, not running "
                                    f"under {by!r}'s claim — claim it first; a completed or "
                                    "failed task is final")
        draft = EventDraft(kind, sleep_key(task_id), body, origin=self.origin, cause=self.cause)
        await self.store.append([draft], expect={sleep_key(task_id): task.version})
        done = await self.state(task_id)
        assert done is not None
        return done
