"""The page each agent host gives the web UI: the tasks its agents were handed and their runs.

One page per host layer (`/<layer>-runs`), built by `agent_runs_page` from the host's run
type and agents: per agent, its tasks by status (assigned, executing, done, given up) from the
engine's Tasks projection, and the newest runs (the host's AgentRun effects) with their state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from pulse_adapters.agents._effects import AgentRun
from pulse_adapters.agents._spec import AgentSpec
from pulse_core import EffectEntry, PageRequest, Tasks, TaskState, UiPage

RUNS_SHOWN = 50
TASKS_SHOWN = 50
DONE = frozenset({"acked", "closed"})


def _run_json(entry: EffectEntry) -> dict[str, Any]:
    body = entry.data.get("effect") if isinstance(entry.data, dict) else None
    body = body if isinstance(body, dict) else {}
    return {"id": entry.id, "task": body.get("task_id"), "agent": body.get("agent"),
            "status": str(entry.status), "attempts": entry.attempt,
            "updated_at": entry.updated_at, "error": entry.error}


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
        tasks = [t for t in request.snapshot.state(Tasks).values() if t.agent in names]
        runs = list(request.effects(run_type.tag()))
        statuses = {name: Counter(t.status for t in tasks if t.agent == name) for name in names}
        ran = Counter(str(_run_json(e)["agent"]) for e in runs)
        return {
            "agents": [{"name": name, "assigned": count["assigned"],
                        "executing": count["executing"],
                        "done": sum(count[s] for s in DONE), "given_up": count["given-up"],
                        "runs": ran[name]}
                       for name, count in statuses.items()],
            "runs": [_run_json(e) for e in runs[:RUNS_SHOWN]],
            "tasks": [_task_json(t) for t in sorted(
                tasks, key=lambda t: t.assigned_at or 0, reverse=True)[:TASKS_SHOWN]],
        }

    return UiPage(f"{layer}-runs", f"{host} runs", view, projections=(Tasks(),))
