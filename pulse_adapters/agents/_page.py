"""The page each agent host gives the web UI: the tasks its agents were handed and their runs.

One page per host layer (`/<layer>-runs`), built by `agent_runs_page` from the host's run
type and agents: per agent, its tasks by status (assigned, executing, done, given up) from the
engine's Tasks projection, and the newest runs (the host's AgentRun effects) with their state.
`run_view` is what the page and `upulse runs` say of one run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from pulse_adapters.agents._effects import AgentRun, run_task_of
from pulse_adapters.agents._spec import AgentSpec
from pulse_core import EffectEntry, PageRequest, Tasks, TaskState, UiPage

RUNS_SHOWN = 50
TASKS_SHOWN = 50
DONE = frozenset({"acked", "closed"})


class AgentRunView(msgspec.Struct, frozen=True, kw_only=True):
    """One agent run as an operator reads it: its effect `id` and `type` (the host's run
    tag), the `task` and `agent`, the effect's `status`, what it did to the task (`outcome`:
    closed, requeued, given-up or moved-on; None while it runs), `started_at` (when its
    process started, when known), `duration_ms`, `exit_code`, the object hashes of its
    `transcript` (stdout) and `stderr` tail, the host's `session`, the reason it failed,
    and the token counts its host reported (`tokens`: the `*_tokens` fields of the usage
    a host stored with the task's result; None when it reported none)."""

    id: str
    type: str
    task: str | None
    agent: str | None
    status: str
    attempts: int
    created_at: int
    updated_at: int
    outcome: str | None = None
    started_at: int | None = None
    duration_ms: int | None = None
    exit_code: int | None = None
    transcript: str | None = None
    stderr: str | None = None
    session: str | None = None
    reason: str | None = None
    tokens: dict[str, int] | None = None


def is_agent_run(entry: EffectEntry) -> bool:
    """Whether `entry` is an AgentRun effect of any host (its dedup key says so)."""
    return run_task_of(entry.dedup) is not None


def reported_tokens(task: TaskState | None, transcript: str | None) -> dict[str, int] | None:
    """The `*_tokens` counts of the usage `task`'s result holds, when that result is the
    run's whose transcript is `transcript` (a closed task's result is its last run's)."""
    result = task.result if task is not None and isinstance(task.result, dict) else {}
    if transcript is None or result.get("transcript") != transcript:
        return None
    body = result.get("result")
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None
    found = {k: v for k, v in usage.items() if k.endswith("_tokens") and isinstance(v, int)
             and not isinstance(v, bool)}
    return found or None


def run_view(entry: EffectEntry, task: TaskState | None = None, *,
             started_at: int | None = None) -> AgentRunView:
    """What the page and `upulse runs` say of run `entry` (`task`: its task's state, for
    the tokens; `started_at`: its `agent-run-spawned` time, when read)."""
    body = entry.body if isinstance(entry.body, dict) else {}
    done = entry.result if isinstance(entry.result, dict) else {}

    def text(value: Any) -> str | None:
        return value if isinstance(value, str) else None

    def whole(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    transcript = text(done.get("transcript"))
    return AgentRunView(
        id=entry.id, type=entry.tag, task=text(body.get("task_id")),
        agent=text(body.get("agent")), status=str(entry.status), attempts=entry.attempt,
        created_at=entry.created_at, updated_at=entry.updated_at,
        outcome=text(done.get("task")), started_at=started_at,
        duration_ms=whole(done.get("duration_ms")), exit_code=whole(done.get("exit_code")),
        transcript=transcript, stderr=text(done.get("stderr")),
        session=text(done.get("session")),
        reason=text(done.get("reason")) or entry.error,
        tokens=reported_tokens(task, transcript))


def _run_json(entry: EffectEntry, tasks: Mapping[str, TaskState]) -> dict[str, Any]:
    body = entry.body if isinstance(entry.body, dict) else {}
    view = run_view(entry, tasks.get(str(body.get("task_id"))))
    return {**msgspec.to_builtins(view), "error": entry.error}


def _task_json(task: TaskState) -> dict[str, Any]:
    return {"id": task.id, "title": task.title, "agent": task.agent, "status": task.status,
            "assigned_at": task.assigned_at, "finished_at": task.finished_at,
            "requeues": task.requeues}


def agent_runs_page(layer: str, host: str, run_type: type[AgentRun],
                    agents: Sequence[AgentSpec]) -> UiPage:
    """The page of host layer `layer` (`host` names it in the nav) whose runs are
    `run_type` effects on `agents`."""
    names = [a.name for a in agents]

    async def view(request: PageRequest) -> dict[str, Any]:
        every = request.snapshot.state(Tasks)
        tasks = [t for t in every.values() if t.agent in names]
        runs = list(request.effects(run_type.tag()))
        statuses = {name: Counter(t.status for t in tasks if t.agent == name) for name in names}
        ran = Counter(str(run_view(e).agent) for e in runs)
        return {
            "agents": [{"name": name, "assigned": count["assigned"],
                        "executing": count["executing"],
                        "done": sum(count[s] for s in DONE), "given_up": count["given-up"],
                        "runs": ran[name]}
                       for name, count in statuses.items()],
            "runs": [_run_json(e, every) for e in runs[:RUNS_SHOWN]],
            "tasks": [_task_json(t) for t in sorted(
                tasks, key=lambda t: t.assigned_at or 0, reverse=True)[:TASKS_SHOWN]],
        }

    return UiPage(f"{layer}-runs", f"{host} runs", view, projections=(Tasks(),))
