"""TaskDispatcher: capable free agents, never a task twice (however ticks, dispatchers and
executors race), stuck tasks taken back by the policy."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import ClassVar

from pulse_adapters.agents import AgentRun, AgentSpec, DispatchPolicy, TaskDispatcher
from pulse_core import Effect, Engine, ManualClock, TaskBoard
from tests.adapters.agents.rig import ScriptExecutor, ScriptRun

TEST_TIME_LIMIT_S = 60


class OtherRun(AgentRun, tag="other-script-run"):
    """A second host's run type, for two dispatchers over the same tasks."""


class OtherExecutor(ScriptExecutor):
    handles: ClassVar[tuple[type[Effect], ...]] = (OtherRun,)


async def _create(engine: Engine, count: int, prompt: str = "ok") -> list[str]:
    board = TaskBoard(engine.events)
    ids = [f"t-{i}" for i in range(count)]
    for task_id in ids:
        await board.create(task_id, f"task {task_id}", prompt=prompt)
    return ids


async def _assert_each_ran_once(engine: Engine, ids: list[str]) -> None:
    assigned = Counter(e.key for e in await engine.events.read(kinds=["task-assigned"]))
    assert assigned == dict.fromkeys(ids, 1)
    acked = await engine.events.read(kinds=["effect-acked"])
    ran = Counter(a.data["result"].get("dispatched") for a in acked)
    assert ran[True] == len(ids)
    tasks = (await engine.snapshot()).projection("tasks")
    assert {tasks[i].status for i in ids} == {"closed"}


async def test_concurrent_ticks_dispatch_each_task_once(tmp_path: Path) -> None:
    agents = [AgentSpec(name="a", concurrency=2), AgentSpec(name="b", concurrency=2)]
    engine = Engine(tmp_path / "home", rules=[TaskDispatcher(ScriptRun, agents)],
                    executors=[ScriptExecutor(tmp_path / "pids")], clock=ManualClock())
    await engine.open()
    try:
        ids = await _create(engine, 6)
        await asyncio.gather(engine.tick(), engine.tick(), engine.tick())
        await engine.executor_loop.run_until_idle()
        for _ in range(3):
            await engine.step()
        await _assert_each_ran_once(engine, ids)
    finally:
        await engine.close()


async def test_two_dispatchers_of_one_engine_are_deduplicated(tmp_path: Path) -> None:
    agents = [AgentSpec(name="a", concurrency=4)]
    engine = Engine(tmp_path / "home",
                    rules=[TaskDispatcher(ScriptRun, agents), TaskDispatcher(OtherRun, agents)],
                    executors=[ScriptExecutor(tmp_path / "pids"),
                               OtherExecutor(tmp_path / "pids")],
                    clock=ManualClock())
    await engine.open()
    try:
        ids = await _create(engine, 3)
        decision = await engine.step()
        assert len(decision.effects) == 3
        assert len(await engine.events.read(kinds=["effect"])) == 3
        await _assert_each_ran_once(engine, ids)
    finally:
        await engine.close()


async def test_two_engines_racing_on_one_log_run_each_task_once(tmp_path: Path) -> None:
    store = f"sqlite://{tmp_path / 'shared.db'}"
    agents = [AgentSpec(name="a", concurrency=3), AgentSpec(name="b", concurrency=3)]
    engines = [Engine(tmp_path / name, store=store, host=name,
                      rules=[TaskDispatcher(ScriptRun, agents)],
                      executors=[ScriptExecutor(tmp_path / f"pids-{name}")])
               for name in ("x", "y")]
    for engine in engines:
        await engine.open()
    try:
        ids = await _create(engines[0], 5, prompt="slow")
        await asyncio.gather(*(e.tick() for e in engines))  # both see every task pending
        runs = await engines[0].events.read(kinds=["effect"])
        # Mostly each engine decides every task (10): the executors must refuse the second.
        # The second tick may see the first one's runs pending already, and skip those.
        assert 5 <= len(runs) <= 10
        await asyncio.gather(*(e.executor_loop.run_until_idle() for e in engines))
        await _assert_each_ran_once(engines[0], ids)
        refused = [a.data["result"] for a in await engines[0].events.read(kinds=["effect-acked"])
                   if not a.data["result"]["dispatched"]]
        assert len(refused) == len(runs) - 5
        assert all("version" in r["reason"] for r in refused)
    finally:
        for engine in engines:
            await engine.close()


async def test_a_stuck_task_is_requeued_then_given_up(tmp_path: Path) -> None:
    clock = ManualClock()
    policy = DispatchPolicy(stuck_after_s=60, max_requeues=1)
    dispatcher = TaskDispatcher(ScriptRun, [AgentSpec(name="a")], policy)
    engine = Engine(tmp_path / "home", rules=[dispatcher],
                    executors=[ScriptExecutor(tmp_path / "pids", policy=policy)], clock=clock)
    await engine.open()
    try:
        board = TaskBoard(engine.events)
        await board.create("t-1", "lost", prompt="ok")
        await board.assign("t-1", "a")  # by hand: no run under way will ever finish it
        await board.start("t-1")
        decision = await engine.step()
        assert not decision.effects and decision.tick_ms <= 60_000
        clock.advance(60_000)
        [timed_out] = (await engine.step()).effects
        assert type(timed_out).tag() == "script-run-timed-out"
        task = await board.state("t-1")
        assert task is not None and task.status == "pending" and task.requeues == 1
        assert "a: stuck executing for 60 s" in (task.reason or "")
        await engine.step()  # dispatched again, and this time it runs
        assert (await board.state("t-1")).status == "closed"  # type: ignore[union-attr]

        await board.create("t-2", "lost again", prompt="ok")
        for _ in range(2):
            await board.assign("t-2", "a")
            clock.advance(61_000)
            await engine.step()
            if (await board.state("t-2")).status == "given-up":  # type: ignore[union-attr]
                break
        task = await board.state("t-2")
        assert task is not None and task.status == "given-up"
        assert "max_requeues=1" in (task.reason or "")
        kinds = [e.kind for e in await engine.events.read(key="t-2")]
        assert kinds == ["task-created", "task-assigned", "task-requeued", "task-assigned",
                         "task-given-up"]
    finally:
        await engine.close()


async def test_a_dispatched_run_counts_toward_its_agent_until_it_assigns(tmp_path: Path) -> None:
    dispatcher = TaskDispatcher(ScriptRun, [AgentSpec(name="a", projects=("web",))])
    engine = Engine(tmp_path / "home", rules=[dispatcher],
                    executors=[ScriptExecutor(tmp_path / "pids")], clock=ManualClock())
    await engine.open()
    try:
        board = TaskBoard(engine.events)
        await board.create("t-1", "web work", project="web", prompt="ok")
        await board.create("t-2", "more web work", project="web", prompt="ok")
        await board.create("t-3", "ops work", project="ops", prompt="ok")
        first = await engine.tick()
        assert [e.task_id for e in first.effects if isinstance(e, ScriptRun)] == ["t-1"]
        second = await engine.tick()  # t-1's run has not assigned yet: "a" is still busy
        assert not second.effects
        await engine.executor_loop.run_until_idle()
        third = await engine.tick()
        assert [e.task_id for e in third.effects if isinstance(e, ScriptRun)] == ["t-2"]
    finally:
        await engine.close()
