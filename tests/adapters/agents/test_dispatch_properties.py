"""The dispatcher's invariant, for any pending tasks and agents: in one tick no task goes to
two agents, no agent past its concurrency (its open tasks included), every task to an agent
that takes its project, and no task left waiting while a capable agent has a free slot."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from pulse_adapters.agents import AgentSpec, TaskDispatcher
from pulse_core import (
    AgentCapabilityStats,
    Decision,
    Event,
    PendingTasks,
    Projection,
    Snapshot,
    Tasks,
)
from tests.adapters.agents.rig import ScriptRun

PROJECTS = ("web", "ops", "docs")
AGENTS = ("a", "b", "c", "d")

agent_specs = st.lists(
    st.builds(lambda name, projects, concurrency: AgentSpec(
        name=name, projects=projects, concurrency=concurrency),
        st.sampled_from(AGENTS),
        st.one_of(st.just(("*",)),
                  st.lists(st.sampled_from(PROJECTS), min_size=1, max_size=2, unique=True
                           ).map(tuple)),
        st.integers(1, 3)),
    min_size=1, max_size=4, unique_by=lambda a: a.name)

# each task: its project, priority, and who holds it (None: pending), whether it runs
tasks = st.lists(st.tuples(st.sampled_from(PROJECTS), st.integers(0, 3),
                           st.one_of(st.none(), st.sampled_from(AGENTS)), st.booleans()),
                 max_size=25)


def _fold(specs: list[tuple[str, int, str | None, bool]]) -> dict[str, Any]:
    """The task projections after creating each task and, where it says, assigning it."""
    projections: list[Projection[Any]] = [Tasks(), PendingTasks(), AgentCapabilityStats()]
    states = {p.name: p.initial() for p in projections}
    seq = 0

    def event(kind: str, key: str, version: int, data: Any) -> Event:
        nonlocal seq
        seq += 1
        return Event(seq, f"id-{seq}", kind, key, version, seq * 10, "test", None, "", None,
                     data, None)

    for i, (project, priority, holder, started) in enumerate(specs):
        key = f"t-{i:02}"
        stream = [event("task-created", key, 1, {"title": key, "project": project,
                                                   "priority": priority})]
        if holder is not None:
            stream.append(event("task-assigned", key, 2, {"agent": holder}))
            if started:
                stream.append(event("task-executing", key, 3, None))
        for e in stream:
            for p in projections:
                if p.kinds is None or e.kind in p.kinds:
                    states[p.name] = p.apply(states[p.name], e)
    return states


async def _inner(prev: Snapshot, curr: Snapshot) -> Decision:
    return Decision([], 5_000)


@settings(max_examples=300, deadline=None)
@given(agent_specs, tasks)
def test_no_task_twice_no_agent_past_its_concurrency(agents: list[AgentSpec],
                                                     specs: list[tuple[str, int, str | None,
                                                                       bool]]) -> None:
    states = _fold(specs)
    snapshot = Snapshot(seq=0, at=1_000, number=1, vitals={}, projections=states)
    dispatcher = TaskDispatcher(ScriptRun, agents)
    decision = asyncio.run(dispatcher(snapshot, snapshot, _inner))
    runs = [e for e in decision.effects if isinstance(e, ScriptRun)]
    by_task = Counter(r.task_id for r in runs)
    assert all(n == 1 for n in by_task.values())
    task_states = states["tasks"]
    held = Counter(t.agent for t in task_states.values() if t.status in ("assigned",
                                                                         "executing"))
    given_to = Counter(r.agent for r in runs)
    spec = {a.name: a for a in agents}
    for name, count in given_to.items():
        assert count + held[name] <= spec[name].concurrency
    for run in runs:
        task = task_states[run.task_id]
        assert task.status == "pending" and spec[run.agent].takes(task.project)
        assert run.task_version == task.version and run.project == task.project
    for task in task_states.values():  # greedy to the end: nothing waits beside a free slot
        if task.status == "pending" and task.id not in by_task:
            for agent in agents:
                if agent.takes(task.project):
                    assert given_to[agent.name] + held[agent.name] >= agent.concurrency
    order = [r.task_id for r in runs]
    pending_order = [t for t in states["pending-tasks"].tasks if t in by_task]
    assert order == pending_order  # priority first, then age
    # A second tick that sees these runs pending dispatches none of their tasks again.
    pending = frozenset(r.dedup_key() for r in runs)
    again = msgspec.structs.replace(snapshot, pending_effects=pending, number=2)
    second = asyncio.run(dispatcher(snapshot, again, _inner))
    more = [e for e in second.effects if isinstance(e, ScriptRun)]
    assert not {r.task_id for r in more} & set(by_task)
    for name, count in Counter(r.agent for r in more).items():  # the first runs still count
        assert count + given_to[name] + held[name] <= spec[name].concurrency
