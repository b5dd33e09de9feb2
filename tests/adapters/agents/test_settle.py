"""How a task is settled when its run does not finish on its own: a take-back that came too
late leaves a newer run alone, and a run cut short by the engine's shutdown is requeued,
whatever the policy says of failures."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from pulse_adapters.agents import AgentSpec, DispatchPolicy, TaskDispatcher, timed_out_type
from pulse_core import Engine, ExecutionContext, ManualClock, SystemClock, TaskBoard
from tests.adapters.agents.rig import ScriptExecutor, ScriptRun, gone, stand_in_pids

TEST_TIME_LIMIT_S = 60

AGENT = "coder"


async def test_a_stale_take_back_leaves_the_task_s_newer_live_run_alone(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    executor = ScriptExecutor(pids)
    engine = Engine(tmp_path / "home", executors=[executor], clock=ManualClock())
    await engine.open()
    running: asyncio.Task[object] | None = None
    try:
        board = TaskBoard(engine.events)
        await board.create("t-1", "long work", prompt="hang")
        await board.assign("t-1", AGENT)
        stuck = await board.start("t-1")  # stuck here: a take-back is decided at this version
        stale = timed_out_type(ScriptRun)(task_id="t-1", task_version=stuck.version,
                                          agent=AGENT, reason="stuck (decided long ago)")
        requeued = await board.requeue("t-1", "taken back by hand",
                                       expect_version=stuck.version)
        run = ScriptRun(task_id="t-1", task_version=requeued.version, agent=AGENT,
                        prompt="hang", project="default")
        ctx = ExecutionContext("e-run", 1, 0, "test", SystemClock(), engine.events)
        running = asyncio.create_task(executor.execute(run, ctx))
        leader, child = await stand_in_pids(pids)  # the newer run is under way

        late = ExecutionContext("e-late", 2, 0, "test", SystemClock(), engine.events)
        outcome = await executor.execute(stale, late)

        assert outcome["timed_out"] is False and "moved on" in outcome["reason"]
        task = await board.state("t-1")
        assert task is not None and task.status == "executing" and task.requeues == 1
        assert not gone(leader) and not gone(child)  # the live run's group is untouched
    finally:
        if running is not None:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
        await engine.close()


async def test_a_run_cut_short_by_shutdown_is_requeued_even_when_failures_are_given_up(
        tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    policy = DispatchPolicy(requeue_on_failure=False)
    executor = ScriptExecutor(pids, policy=policy)
    home = tmp_path / "home"
    engine = Engine(home, rules=[TaskDispatcher(ScriptRun, [AgentSpec(name=AGENT)], policy)],
                    executors=[executor], clock=ManualClock(), drain_timeout=0.5)
    await engine.open()
    try:
        await TaskBoard(engine.events).create("t-1", "long work", prompt="hang")
        await engine.tick()  # the run is decided
        await engine.start()  # and claimed by the executor loop
        leader, child = await stand_in_pids(pids)
    finally:
        await engine.close()  # the run outlasts the drain: it is interrupted
    assert gone(leader) and gone(child)

    after = Engine(home, clock=ManualClock())
    await after.open()
    try:
        task = await TaskBoard(after.events).state("t-1")
        assert task is not None and task.status == "pending", task
        assert (task.reason or "").startswith("interrupted: the run was cancelled")
        kinds = [e.kind for e in await after.events.read(key="t-1")]
        assert "task-given-up" not in kinds
    finally:
        await after.close()
