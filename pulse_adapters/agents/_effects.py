"""The effects of agent dispatch: run a task on an agent, and take back a stuck task."""

from __future__ import annotations

import types
from typing import ClassVar

from pulse_core import Effect


class AgentRun(Effect):
    """Run task `task_id` on `agent`: the base of every host's run effect (each host
    subclasses it with its tag: `class CursorRun(AgentRun, tag="cursor-run")`).

    `task_version` is the version the dispatcher saw the task pending at; the executor
    assigns only at that version, so a task is never run twice. The dedup key is the same
    for every host, so two layers dispatching one task in one tick are one action. Any
    engine sharing the log may run it: the task is in the log, not on a host.
    """

    any_host: ClassVar[bool] = True

    task_id: str
    task_version: int
    agent: str
    prompt: str
    project: str

    def dedup_key(self) -> str:
        return f"agent-run:{self.task_id}:{self.task_version}"


RUN_KEY_PREFIX = "agent-run:"


def run_task_of(dedup_key: str) -> str | None:
    """The task id in an AgentRun's dedup key (None for another effect's key)."""
    if not dedup_key.startswith(RUN_KEY_PREFIX):
        return None
    task, sep, _ = dedup_key[len(RUN_KEY_PREFIX):].rpartition(":")
    return task if sep else None


class TaskTimedOut(Effect):
    """Task `task_id`, assigned to `agent` and stuck at `task_version`, is to be requeued or
    given up (by the dispatch policy) with `reason`. Each run effect type has its own
    (`timed_out_type`), run by the same executor as the runs; the dedup key is shared."""

    any_host: ClassVar[bool] = True

    task_id: str
    task_version: int
    agent: str
    reason: str

    def dedup_key(self) -> str:
        return f"task-timed-out:{self.task_id}:{self.task_version}"


_timed_out: dict[type[AgentRun], type[TaskTimedOut]] = {}


def timed_out_type(run_type: type[AgentRun]) -> type[TaskTimedOut]:
    """The TaskTimedOut type of `run_type`: tag `<run tag>-timed-out` (one per run type, so
    each host's executor handles its own)."""
    found = _timed_out.get(run_type)
    if found is None:
        tag = f"{run_type.tag()}-timed-out"
        found = types.new_class(f"{run_type.__name__}TimedOut", (TaskTimedOut,),
                                {"tag": tag})
        found.__module__ = run_type.__module__
        found.__doc__ = f"A stuck task of {run_type.__name__} (tag {tag!r})."
        _timed_out[run_type] = found
    return found
