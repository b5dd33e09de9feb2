"""TaskDispatcher: the rule that hands pending tasks to a host's agents, and takes stuck ones
back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pulse_adapters.agents._effects import (
    AgentRun,
    TaskTimedOut,
    run_task_of,
    timed_out_type,
)
from pulse_adapters.agents._program import ProgramCheck
from pulse_adapters.agents._spec import AgentSpec, DispatchPolicy
from pulse_core import (
    AgentCapabilityStats,
    AgentStats,
    Decision,
    Effect,
    Inner,
    PendingTasks,
    Snapshot,
    Tasks,
    TaskState,
)

_OPEN = frozenset({"assigned", "executing"})
_MIN_TICK_MS = 1_000


def plan_dispatch(pending: Iterable[TaskState], agents: Sequence[AgentSpec],
                  load: Mapping[str, int], stats: Mapping[str, AgentStats]
                  ) -> list[tuple[TaskState, AgentSpec]]:
    """Which pending task goes to which agent, in the order of `pending`: to a capable agent
    with a free slot (`load` counts its open tasks), the one with the fewest failures in a row,
    then the fastest, then by name. No task twice, no agent past its concurrency."""
    free = {a.name: a.concurrency - load.get(a.name, 0) for a in agents}
    none = AgentStats()

    def rank(agent: AgentSpec) -> tuple[int, float, str]:
        known = stats.get(agent.name, none)
        return (known.consecutive_failures, known.avg_duration_ms, agent.name)

    ranked = sorted({a.name: a for a in agents}.values(), key=rank)
    plan: list[tuple[TaskState, AgentSpec]] = []
    given: set[str] = set()
    for task in pending:
        if not any(free[a.name] > 0 for a in ranked):
            break
        if task.id in given:
            continue
        for agent in ranked:
            if free[agent.name] > 0 and agent.takes(task.project):
                free[agent.name] -= 1
                given.add(task.id)
                plan.append((task, agent))
                break
    return plan


class TaskDispatcher:
    """The rule that dispatches a host's tasks: each tick (after the rules inside it) it
    emits one `effect_type` run per pending task it can place (see `plan_dispatch`), and a
    TaskTimedOut for each task one of its agents holds longer than `policy.stuck_after_s`
    with no run under way.

    A task whose run is pending (here, or from another engine sharing the log) is not
    dispatched again; runs it emitted that have not yet assigned their task count toward
    their agent's load. While `program` reports a problem, nothing is dispatched.
    """

    emits: tuple[type[Effect], ...]

    def __init__(self, effect_type: type[AgentRun], agents: Sequence[AgentSpec],
                 policy: DispatchPolicy | None = None, *,
                 program: ProgramCheck | None = None) -> None:
        names = [a.name for a in agents]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"agent names must be unique; repeated: {', '.join(repeated)}")
        self.effect_type = effect_type
        self.timed_out_type: type[TaskTimedOut] = timed_out_type(effect_type)
        self.agents = tuple(agents)
        self.policy = policy or DispatchPolicy()
        self.program = program
        self.name = f"{effect_type.tag()}-dispatcher"
        self.emits = (effect_type, self.timed_out_type)
        self._by_name = {a.name: a for a in self.agents}
        self._emitted: dict[str, tuple[int, str]] = {}  # task -> (version, agent) not assigned

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        names = (Tasks.name, PendingTasks.name, AgentCapabilityStats.name)
        if not set(names) <= curr.projections.keys():
            return Decision(effects, tick_ms)
        tasks = curr.state(Tasks)
        capability = curr.state(AgentCapabilityStats)
        running = {t for t in map(run_task_of, curr.pending_effects) if t is not None}
        load: dict[str, int] = {}
        stuck: list[Effect] = []
        stuck_ms = int(self.policy.stuck_after_s * 1000)
        next_due: int | None = None
        for task_id, (agent, since) in capability.open.items():
            task = tasks.get(task_id)
            if agent not in self._by_name or task is None or task.status not in _OPEN:
                continue
            load[agent] = load.get(agent, 0) + 1
            if task_id in running:
                continue
            due = since + stuck_ms
            if due > curr.at:
                next_due = due if next_due is None else min(next_due, due)
                continue
            timed_out = self.timed_out_type(
                task_id=task_id, task_version=task.version, agent=agent,
                reason=(f"{agent}: stuck {task.status} for {(curr.at - since) // 1000} s with "
                        f"no run under way (stuck_after_s={self.policy.stuck_after_s:g})"))
            if timed_out.dedup_key() not in curr.pending_effects:
                stuck.append(timed_out)
        for task_id, (version, agent) in list(self._emitted.items()):
            task = tasks.get(task_id)
            key = f"agent-run:{task_id}:{version}"
            if task is None or task.version != version or key not in curr.pending_effects:
                del self._emitted[task_id]  # assigned (counted above) or finished without
            else:
                load[agent] = load.get(agent, 0) + 1
        runs = [] if self.program is not None and self.program.problem else \
            self._dispatch(curr, tasks, capability.agents, load)
        if next_due is not None:
            tick_ms = min(tick_ms, max(_MIN_TICK_MS, next_due - curr.at))
        return Decision([*effects, *runs, *stuck], tick_ms)

    def _dispatch(self, curr: Snapshot, tasks: Mapping[str, TaskState],
                  stats: Mapping[str, AgentStats], load: Mapping[str, int]) -> list[Effect]:
        def waiting() -> Iterable[TaskState]:
            for task_id in curr.state(PendingTasks).tasks:
                task = tasks.get(task_id)
                if task is None or task.status != "pending":
                    continue
                run_key = f"agent-run:{task_id}:{task.version}"
                if run_key not in curr.pending_effects and task_id not in self._emitted:
                    yield task

        runs: list[Effect] = []
        for task, agent in plan_dispatch(waiting(), self.agents, load, stats):
            runs.append(self.effect_type(task_id=task.id, task_version=task.version,
                                         agent=agent.name, prompt=task.prompt,
                                         project=task.project))
            self._emitted[task.id] = (task.version, agent.name)
        return runs
