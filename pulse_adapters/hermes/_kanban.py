"""Hermes' own kanban board mirrored into pulse tasks.

Each run of a Hermes kanban task (a claim by Hermes' dispatcher) is one pulse task, keyed
`hermes:<board>:<task id>:<run id>`, in the project `hermes-kanban`: `kanban_task_claimed`
takes it to executing, `kanban_task_completed` to acked (the summary as result) and closed,
`kanban_task_blocked` to given up with the block's reason. A hook seen without the earlier
ones (the claim fired in another process) writes the steps it missed in the same append, at
the version the task was read at, so the mirror never skips or repeats a transition; a task
created and assigned in one append is never pending, so no pulse dispatcher hands it out.
"""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec

from pulse_core import EventDraft, EventStore, TaskBoard, VersionConflict

PROJECT = "hermes-kanban"
ORIGIN = "agent:hermes-kanban"
HOOKS = ("kanban_task_claimed", "kanban_task_completed", "kanban_task_blocked")
_PATH = ("pending", "assigned", "executing", "acked", "closed")
_FINISHED = frozenset({"closed", "given-up"})
_ATTEMPTS = 5  # another process moved the task between the read and the append: read again


class KanbanTransition(msgspec.Struct, frozen=True, kw_only=True):
    """One kanban lifecycle hook as Hermes fired it (its keyword arguments)."""

    hook: str
    task_id: str
    board: str | None = None
    assignee: str | None = None
    run_id: int | None = None
    profile_name: str = "default"
    summary: str | None = None
    reason: str | None = None

    @property
    def key(self) -> str:
        """The pulse task id this run of the kanban task is mirrored as."""
        run = "" if self.run_id is None else f":{self.run_id}"
        return f"hermes:{self.board or 'default'}:{self.task_id}{run}"

    @property
    def agent(self) -> str:
        """The agent named in the mirrored task-assigned."""
        return f"hermes:{self.assignee or self.profile_name}"


def _step(status: str, change: KanbanTransition, title: str) -> EventDraft:
    """The draft that moves the mirrored task into `status`."""
    kind, data = {
        "pending": ("task-created", {"title": title or f"Hermes kanban task {change.task_id}",
                                     "project": PROJECT}),
        "assigned": ("task-assigned", {"agent": change.agent}),
        "executing": ("task-executing", None),
        "acked": ("task-acked", {"result": {"summary": change.summary,
                                            "run_id": change.run_id}}),
        "closed": ("task-closed", None),
    }[status]
    return EventDraft(kind, change.key, data, origin=ORIGIN)


async def mirror(events: EventStore, change: KanbanTransition, title: str = "") -> int:
    """Append what `change` means for its pulse task; how many transitions were written
    (0: the task is there already, or finished). When another writer (the hook in another
    Hermes process) moves the task between the read and the append, the task is read again;
    VersionConflict only when that keeps happening."""
    for _ in range(_ATTEMPTS - 1):
        with contextlib.suppress(VersionConflict):
            return await _mirror_once(events, change, title)
    return await _mirror_once(events, change, title)


async def _mirror_once(events: EventStore, change: KanbanTransition, title: str) -> int:
    task = await TaskBoard(events).state(change.key)
    status = "absent" if task is None else task.status
    if status in _FINISHED:
        return 0
    done = _PATH.index(status) + 1 if status in _PATH else 0
    drafts: list[EventDraft]
    if change.hook == "kanban_task_blocked":
        drafts = [_step(s, change, title) for s in _PATH[done:3]]
        reason = f"blocked in Hermes kanban: {change.reason or 'no reason given'}"
        drafts.append(EventDraft("task-given-up", change.key, {"reason": reason},
                                 origin=ORIGIN))
    else:
        target = 3 if change.hook == "kanban_task_claimed" else len(_PATH)
        drafts = [_step(s, change, title) for s in _PATH[done:target]]
    if drafts:
        await events.append(drafts, expect={change.key: 0 if task is None else task.version})
    return len(drafts)


def kanban_title(task_id: str, board: str | None) -> str:
    """The kanban task's title from Hermes' board database ('' when it cannot be read).
    Runs inside a Hermes process only; blocking."""
    try:
        import importlib

        kanban: Any = importlib.import_module("hermes_cli.kanban_db")
        with kanban.connect_closing(board=board) as conn:
            found = kanban.get_task(conn, task_id)
        return str(found.title) if found is not None else ""
    except Exception:  # an observer: a board it cannot read only costs the title
        return ""
