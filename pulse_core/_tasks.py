"""The task lifecycle as events, and the projections rules use to hand out work.

::

    task-created ─▶ task-assigned ─▶ task-executing ─▶ task-acked ─▶ task-closed
         │              ▲  │                 │
         │              │  └── task-requeued ┘  (back to pending, for any agent)
         │              └──────────┘
         └──────────────┴────────────────┴──────────────────┴──────▶ task-given-up

Each transition is appended with the task's expected version, so a task can never be
assigned (or closed) twice, whatever races.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from pulse_core._errors import InvalidTransition, VersionConflict
from pulse_core._events import QUARANTINED, Event, EventDraft, register_kind
from pulse_core._pmap import PersistentMap
from pulse_core._snapshot import Projection
from pulse_core.store import EventStore


class TaskCreated(msgspec.Struct, frozen=True):
    """Payload of task-created."""

    title: str
    project: str = "default"
    prompt: str = ""
    priority: int = 0


class TaskAssigned(msgspec.Struct, frozen=True):
    """Payload of task-assigned."""

    agent: str


class TaskAcked(msgspec.Struct, frozen=True):
    """Payload of task-acked."""

    result: Any = None


class TaskGivenUp(msgspec.Struct, frozen=True):
    """Payload of task-given-up."""

    reason: str


class TaskRequeued(msgspec.Struct, frozen=True):
    """Payload of task-requeued."""

    reason: str


register_kind("task-created", "a task was created; key: task id", TaskCreated)
register_kind("task-assigned", "a task was given to an agent", TaskAssigned)
register_kind("task-executing", "the assigned agent started the task")
register_kind("task-acked", "the agent reported a result", TaskAcked)
register_kind("task-closed", "the task is done")
register_kind("task-given-up", "the task was abandoned; data: reason", TaskGivenUp)
register_kind("task-requeued", "an assigned task went back to pending; data: reason",
              TaskRequeued)

TASK_KINDS = frozenset(
    {"task-created", "task-assigned", "task-executing", "task-acked", "task-closed",
     "task-given-up", "task-requeued"}
)

# status reached by each kind, and the statuses it may follow
_TRANSITIONS: dict[str, tuple[str, frozenset[str]]] = {
    "task-assigned": ("assigned", frozenset({"pending"})),
    "task-executing": ("executing", frozenset({"assigned"})),
    "task-acked": ("acked", frozenset({"executing"})),
    "task-closed": ("closed", frozenset({"acked"})),
    "task-given-up": ("given-up", frozenset({"pending", "assigned", "executing", "acked"})),
    "task-requeued": ("pending", frozenset({"assigned", "executing"})),
}


class TaskState(msgspec.Struct, frozen=True, rename="camel"):
    """A task's whole current form."""

    id: str
    title: str
    project: str
    prompt: str
    priority: int
    status: str
    version: int
    created_at: int
    agent: str | None = None
    assigned_at: int | None = None
    finished_at: int | None = None
    result: Any = None
    reason: str | None = None
    requeues: int = 0


def next_task_state(state: TaskState | None, event: Event) -> TaskState | None:
    """The task after `event`; InvalidTransition when its status does not allow it."""
    if event.kind == "task-created":
        if state is not None:
            raise InvalidTransition(f"task {event.key!r} already exists ({state.status})")
        body = event.payload(TaskCreated)
        return TaskState(event.key, body.title, body.project, body.prompt, body.priority,
                         "pending", event.version, event.ts)
    if event.kind == QUARANTINED:  # one of its rows is unreadable: only the version moves
        return None if state is None else msgspec.structs.replace(state, version=event.version)
    if event.kind not in _TRANSITIONS:
        return state
    status, allowed = _TRANSITIONS[event.kind]
    if state is None or state.status not in allowed:
        current = "absent" if state is None else state.status
        raise InvalidTransition(
            f"{event.kind} needs task {event.key!r} to be {' or '.join(sorted(allowed))}; "
            f"it is {current}"
        )
    changes: dict[str, Any] = {"status": status, "version": event.version}
    if event.kind == "task-assigned":
        changes.update(agent=event.payload(TaskAssigned).agent, assigned_at=event.ts)
    elif event.kind == "task-acked":
        changes["result"] = event.payload(TaskAcked).result
    elif event.kind in ("task-closed", "task-given-up"):
        changes["finished_at"] = event.ts
        if event.kind == "task-given-up":
            changes["reason"] = event.payload(TaskGivenUp).reason
    elif event.kind == "task-requeued":
        changes.update(agent=None, assigned_at=None, requeues=state.requeues + 1,
                       reason=event.payload(TaskRequeued).reason)
    return msgspec.structs.replace(state, **changes)


class Tasks(Projection[PersistentMap[str, TaskState]]):
    """Every task by id (TaskState)."""

    name = "tasks"
    kinds = TASK_KINDS

    def initial(self) -> PersistentMap[str, TaskState]:
        return PersistentMap()

    def apply(self, state: PersistentMap[str, TaskState], event: Event
              ) -> PersistentMap[str, TaskState]:
        try:
            task = next_task_state(state.get(event.key), event)
        except InvalidTransition:
            return state  # written by a writer that skipped the board's checks; ignore
        if task is None:
            return state
        return state.set(event.key, task)


class PendingTasksData(msgspec.Struct, frozen=True, rename="camel"):
    """Tasks waiting for an agent: how many, which, and how many per project.

    `tasks` orders them highest priority first, then oldest; it is computed when asked, so
    keeping this projection current costs the same whatever the backlog. `held` keeps the
    priority and project of each task out with an agent, for when it is requeued.
    """

    pending_count: int = 0
    by_project: dict[str, int] = {}
    waiting: PersistentMap[str, tuple[int, int, str]] = msgspec.field(
        default_factory=PersistentMap)
    held: PersistentMap[str, tuple[int, str]] = msgspec.field(default_factory=PersistentMap)

    @property
    def tasks(self) -> tuple[str, ...]:
        """Pending task ids, highest priority first, then oldest."""
        order = sorted(self.waiting.items(), key=lambda kv: (-kv[1][0], kv[1][1]))
        return tuple(task for task, _ in order)


class PendingTasks(Projection[PendingTasksData]):
    """The tasks waiting for an agent (PendingTasksData): created and not yet assigned, or
    requeued (waiting again with their priority, as of the requeue)."""

    name = "pending-tasks"
    kinds = TASK_KINDS
    version = 2  # 2: held tasks, for task-requeued

    def initial(self) -> PendingTasksData:
        return PendingTasksData()

    def apply(self, state: PendingTasksData, event: Event) -> PendingTasksData:
        key, held = event.key, state.held
        if event.kind == "task-created" and key not in state.waiting and key not in held:
            body = event.payload(TaskCreated)
            waiting = state.waiting.set(key, (body.priority, event.seq, body.project))
            project, step = body.project, 1
        elif event.kind == "task-requeued" and key in held:
            priority, project = held[key]
            waiting, held, step = state.waiting.set(key, (priority, event.seq, project)), \
                held.delete(key), 1
        elif event.kind in ("task-assigned", "task-given-up") and key in state.waiting:
            priority, _, project = state.waiting[key]
            waiting, step = state.waiting.delete(key), -1
            if event.kind == "task-assigned":
                held = held.set(key, (priority, project))
        elif event.kind in ("task-closed", "task-given-up") and key in held:
            return msgspec.structs.replace(state, held=held.delete(key))
        else:
            return state
        by_project = dict(state.by_project)
        by_project[project] = by_project.get(project, 0) + step
        if not by_project[project]:
            del by_project[project]
        return PendingTasksData(len(waiting), by_project, waiting, held)


class AgentStats(msgspec.Struct, frozen=True, rename="camel"):
    """How one agent has done with the tasks it was given."""

    assigned: int = 0
    closed: int = 0
    given_up: int = 0
    consecutive_failures: int = 0
    avg_duration_ms: float = 0.0
    requeued: int = 0


class CapabilityData(msgspec.Struct, frozen=True, rename="camel"):
    """AgentStats by agent, and the open assignments they are computed from."""

    agents: dict[str, AgentStats] = {}
    open: PersistentMap[str, tuple[str, int]] = msgspec.field(default_factory=PersistentMap)


class AgentCapabilityStats(Projection[CapabilityData]):
    """Per agent: assigned, closed, given up, requeued, consecutive failures (a give-up or a
    requeue each count one), mean assigned→closed time."""

    name = "agent-capability-stats"
    kinds = frozenset({"task-assigned", "task-closed", "task-given-up", "task-requeued"})

    def initial(self) -> CapabilityData:
        return CapabilityData()

    def apply(self, state: CapabilityData, event: Event) -> CapabilityData:
        agents = dict(state.agents)
        if event.kind == "task-assigned":
            agent = event.payload(TaskAssigned).agent
            stats = agents.get(agent, AgentStats())
            agents[agent] = msgspec.structs.replace(stats, assigned=stats.assigned + 1)
            return CapabilityData(agents, state.open.set(event.key, (agent, event.ts)))
        if event.key not in state.open:
            return state
        agent, since = state.open[event.key]
        stats = agents.get(agent, AgentStats())
        if event.kind == "task-closed":
            duration = event.ts - since
            avg = (stats.avg_duration_ms * stats.closed + duration) / (stats.closed + 1)
            stats = msgspec.structs.replace(
                stats, closed=stats.closed + 1, consecutive_failures=0, avg_duration_ms=avg)
        elif event.kind == "task-requeued":
            stats = msgspec.structs.replace(
                stats, requeued=stats.requeued + 1,
                consecutive_failures=stats.consecutive_failures + 1)
        else:
            stats = msgspec.structs.replace(
                stats, given_up=stats.given_up + 1,
                consecutive_failures=stats.consecutive_failures + 1)
        agents[agent] = stats
        return CapabilityData(agents, state.open.delete(event.key))


class TaskBoard:
    """Moves tasks through their lifecycle, checking each step against the task's status."""

    def __init__(self, store: EventStore, origin: str = "agent") -> None:
        self.store = store
        self.origin = origin

    async def state(self, task_id: str) -> TaskState | None:
        """The task as its events say now (None if it does not exist)."""
        task: TaskState | None = None
        for event in await self.store.read(key=task_id, kinds=[*TASK_KINDS, QUARANTINED]):
            task = next_task_state(task, event)
        return task

    async def create(self, task_id: str, title: str, *, project: str = "default",
                     prompt: str = "", priority: int = 0) -> Event:
        """Create a task; VersionConflict if the id is already taken."""
        body = msgspec.to_builtins(TaskCreated(title, project, prompt, priority))
        draft = EventDraft("task-created", task_id, body, origin=self.origin)
        return (await self.store.append([draft], expect={task_id: 0})).events[0]

    async def _move(self, task_id: str, kind: str, data: Any = None,
                    expect_version: int | None = None) -> Event:
        return (await self._moves(task_id, [(kind, data)], expect_version))[0]

    async def _moves(self, task_id: str, steps: Sequence[tuple[str, Any]],
                     expect_version: int | None) -> Sequence[Event]:
        """Append `steps` (kind, data) to the task in one transaction, each checked against
        the status the one before leaves."""
        task = await self.state(task_id)
        version = task.version if task is not None else 0
        if expect_version is not None and version != expect_version:
            raise VersionConflict(task_id, expect_version, version)
        drafts, probed = [], task
        for kind, data in steps:
            drafts.append(EventDraft(kind, task_id, data, origin=self.origin))
            probe = Event(0, "", kind, task_id, 0, 0, self.origin, None, "", None, data, None)
            probed = next_task_state(probed, probe)
        return (await self.store.append(drafts, expect={task_id: version})).events

    async def assign(self, task_id: str, agent: str, *, expect_version: int | None = None
                     ) -> Event:
        """Give a pending task to `agent`; a second assign fails whatever the timing.

        `expect_version` (None: the version just read) is the version the caller saw the
        task pending at: VersionConflict when it has moved since.
        """
        return await self._move(task_id, "task-assigned", {"agent": agent}, expect_version)

    async def start(self, task_id: str, *, expect_version: int | None = None) -> Event:
        """Record that the assigned agent started."""
        return await self._move(task_id, "task-executing", None, expect_version)

    async def ack(self, task_id: str, result: Any = None, *,
                  expect_version: int | None = None) -> Event:
        """Record the agent's result."""
        return await self._move(task_id, "task-acked", {"result": result}, expect_version)

    async def close(self, task_id: str, *, expect_version: int | None = None) -> Event:
        """Mark an acked task done."""
        return await self._move(task_id, "task-closed", None, expect_version)

    async def ack_and_close(self, task_id: str, result: Any = None, *,
                            expect_version: int | None = None) -> tuple[Event, Event]:
        """Record the agent's result and mark the task done in one append, so no failure
        between the two leaves it acked and never closed; the task-acked and task-closed."""
        acked, closed = await self._moves(
            task_id, [("task-acked", {"result": result}), ("task-closed", None)], expect_version)
        return acked, closed

    async def give_up(self, task_id: str, reason: str, *,
                      expect_version: int | None = None) -> Event:
        """Abandon a task that is not finished."""
        return await self._move(task_id, "task-given-up", {"reason": reason}, expect_version)

    async def requeue(self, task_id: str, reason: str, *,
                      expect_version: int | None = None) -> Event:
        """Take an assigned or executing task back from its agent: pending again, for any
        agent (it counts as a failure of the agent it had)."""
        return await self._move(task_id, "task-requeued", {"reason": reason}, expect_version)
