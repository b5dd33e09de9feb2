"""`upulse runs`: each agent task's runs (OpenClaw, Hermes, Cursor and any other host's
AgentRun effects), and `upulse runs --transcript RUN`: what a run wrote (docs/agents.md).

Both open the home read-only: they never write and never wait for a running daemon. A run is
described by pulse_adapters.agents.run_view, as the hosts' pages describe it.
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec

from pulse_adapters.agents import AgentRunView, is_agent_run, run_view
from pulse_cli.home import CliError, Home
from pulse_cli.maintenance import took
from pulse_cli.output import (
    ago,
    clip,
    did_you_mean,
    now_ms,
    print_json,
    print_table,
    printable,
)
from pulse_cli.queries import read_effects, task_states
from pulse_cli.stores import opened
from pulse_core import (
    EffectEntry,
    EventStore,
)
from pulse_core.store import ObjectStore

SPAWNED = "agent-run-spawned"
HASH_SHOWN = 12
"""The characters of a transcript's hash the table shows (`--json` has it whole)."""
_HEADERS = ("TASK", "RUN", "TYPE", "AGENT", "STATE", "STARTED", "TOOK", "EXIT", "REQUEUES",
            "TOKENS", "TRANSCRIPT")


class TaskRuns(msgspec.Struct, frozen=True, kw_only=True):
    """One task and its runs, oldest first (`status` and `requeues` from its own events)."""

    task: str
    title: str
    status: str
    agent: str | None
    requeues: int
    runs: tuple[AgentRunView, ...]


async def _started(store: EventStore) -> dict[str, int]:
    """When each run's process started: its `agent-run-spawned` time, by effect id."""
    started: dict[str, int] = {}
    for event in await store.read(kinds=[SPAWNED]):
        effect = event.data.get("effect_id") if isinstance(event.data, dict) else None
        if isinstance(effect, str):
            started[effect] = event.ts
    return started


async def read_runs(store: EventStore) -> list[TaskRuns]:
    """Every task with an agent run, in the order its first run was recorded."""
    entries: list[EffectEntry] = [e for e in (await read_effects(store)).values()
                                  if is_agent_run(e)]
    tasks, started = await task_states(store), await _started(store)
    grouped: dict[str, list[AgentRunView]] = {}
    for entry in sorted(entries, key=lambda e: e.seq):
        view = run_view(entry, tasks.get(_task_of(entry)), started_at=started.get(entry.id))
        grouped.setdefault(view.task or "?", []).append(view)
    found: list[TaskRuns] = []
    for task_id, views in grouped.items():
        task = tasks.get(task_id)
        found.append(TaskRuns(
            task=task_id, title=task.title if task else "", status=task.status if task
            else "unknown", agent=task.agent if task else None,
            requeues=task.requeues if task else 0, runs=tuple(views)))
    return found


def _task_of(entry: EffectEntry) -> str:
    body = entry.body if isinstance(entry.body, dict) else {}
    return str(body.get("task_id"))


async def runs(home: Home, *, task: str | None, agent: str | None, transcript: str | None,
               as_json: bool) -> int:
    """Print each agent task's runs (those of `task`, or of `agent`), or with `transcript`,
    the stored transcript of that run."""
    async with opened(home, read_only=True) as stores:
        listed = await read_runs(stores.events)
        if transcript is not None:
            return await _print_transcript(stores.objects, listed, transcript)
    if task is not None:
        picked = [t for t in listed if t.task == task]
        if not picked:
            raise CliError(f"no agent run of task {task!r} in this home"
                           + (did_you_mean(task, [t.task for t in listed])
                              or " — `upulse runs` lists the tasks that ran"))
        listed = picked
    if agent is not None:
        listed = [msgspec.structs.replace(t, runs=tuple(r for r in t.runs if r.agent == agent))
                  for t in listed]
        listed = [t for t in listed if t.runs]
    if as_json:
        print_json(listed)
        return 0
    now = now_ms()
    print_table(_HEADERS, [_row(t, r, now) for t in listed for r in t.runs],
                "no agent runs in this home (a host layer — openclaw, hermes, cursor — runs "
                "the tasks its agents take)")
    return 0


def _row(task: TaskRuns, run: AgentRunView, now: int) -> list[Any]:
    state = run.status if run.outcome is None else f"{run.status}, task {run.outcome}"
    tokens = ", ".join(f"{k.removesuffix('_tokens')} {v}" for k, v in (run.tokens or {}).items())
    return [clip(task.task, 24), clip(run.id, 14), run.type, run.agent or "-", state,
            ago(run.started_at or run.created_at, now), took(run.duration_ms),
            "-" if run.exit_code is None else run.exit_code, task.requeues, tokens or "-",
            (run.transcript or "-")[:HASH_SHOWN]]


async def _print_transcript(objects: ObjectStore, listed: list[TaskRuns], run_id: str) -> int:
    views = {r.id: r for t in listed for r in t.runs}
    view = views.get(run_id) or next(
        (r for r in views.values() if r.transcript and r.transcript.startswith(run_id)), None)
    if view is None:
        raise CliError(f"no agent run {run_id!r} in this home" + (
            did_you_mean(run_id, views) or " — `upulse runs` lists them (RUN, or the "
                                           "TRANSCRIPT hash)"))
    if view.transcript is None:
        raise CliError(f"run {view.id} has no transcript yet ({view.status}) — a run's "
                       "transcript is stored when its process ends")
    data = await objects.get(view.transcript)
    if sys.stdout.isatty():  # a terminal: control sequences from the agent made visible
        print(printable(data.decode("utf-8", errors="replace"), newlines=True), end="")
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return 0
