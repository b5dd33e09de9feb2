"""An engine that dies mid-run leaves its agent's process group running (a session of its
own); the task's takeover or next run ends that group before the task runs again."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import psutil
import pytest

from pulse_adapters.agents import AgentSpec, DispatchPolicy, StreamLimits, TaskDispatcher
from pulse_adapters.agents._executor import SPAWNED, RunSpawned
from pulse_core import Engine, EventDraft, ManualClock, TaskBoard, process_started
from tests.adapters.agents.rig import ScriptExecutor, ScriptRun

TEST_TIME_LIMIT_S = 60


@pytest.fixture
def orphan() -> Iterator[subprocess.Popen[bytes]]:
    """A process group as a dead engine's run leaves it: a leader and a child, in a session
    of their own."""
    leader = subprocess.Popen(  # a child that lives as long as the group
        [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable,"
         " '-c', 'import time; time.sleep(120)']); time.sleep(120)"],
        start_new_session=True)
    yield leader
    leader.kill()
    leader.wait()


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process that never ran an agent: it holds a pid a run once recorded."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _spawned(task: str, pid: int, started: float) -> EventDraft:
    body = RunSpawned("e-dead", task, pid, started, socket.gethostname())
    return EventDraft(SPAWNED, f"agent-run:{task}", msgspec.to_builtins(body),
                      origin="executor:ScriptExecutor")


def _group(pgid: int) -> list[int]:
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.pid != pgid and \
                    os.getpgid(proc.pid) == pgid:
                found.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


async def test_a_stuck_task_s_leftover_process_group_is_killed_before_it_runs_again(
        tmp_path: Path, orphan: subprocess.Popen[bytes]) -> None:
    clock = ManualClock()
    policy = DispatchPolicy(stuck_after_s=60, max_requeues=1)
    executor = ScriptExecutor(tmp_path / "pids", policy=policy)
    engine = Engine(tmp_path / "home", rules=[TaskDispatcher(ScriptRun, [AgentSpec(name="a")],
                                                             policy)],
                    executors=[executor], clock=clock)
    await engine.open()
    try:
        for _ in range(100):  # the leader's own child has started
            if _group(orphan.pid):
                break
            await asyncio.sleep(0.02)
        child = _group(orphan.pid)
        assert child, "the orphan's child did not start"
        board = TaskBoard(engine.events)
        await board.create("t-1", "cut short", prompt="ok")
        await board.assign("t-1", "a")
        await board.start("t-1")  # as the dead engine left it: executing, its group running
        await engine.events.append([_spawned("t-1", orphan.pid,
                                             psutil.Process(orphan.pid).create_time())])
        clock.advance(60_000)
        await engine.step()  # stuck: taken back, and what its run left is ended first
        task = await board.state("t-1")
        assert task is not None and task.status == "pending"
        assert "the process group its last run left running was killed" in (task.reason or "")
        assert orphan.wait(5) is not None
        assert all(not psutil.pid_exists(p) or psutil.Process(p).status() ==
                   psutil.STATUS_ZOMBIE for p in child)
        await engine.step()  # runs again, alone
        assert (await board.state("t-1")).status == "closed"  # type: ignore[union-attr]
    finally:
        await engine.close()


async def test_a_pid_now_used_by_another_process_is_left_alone(
        tmp_path: Path, orphan: subprocess.Popen[bytes]) -> None:
    executor = ScriptExecutor(tmp_path / "pids")
    engine = Engine(tmp_path / "home", executors=[executor], clock=ManualClock())
    await engine.open()
    try:
        started = psutil.Process(orphan.pid).create_time()
        await engine.events.append([_spawned("t-1", orphan.pid, started - 5.0)])
        assert await executor._end_leftover(engine.events, "t-1") is False
        assert orphan.poll() is None
    finally:
        await engine.close()


def wall_clock_start(pid: int) -> float:
    """A process's start as runs spawned by earlier versions of pulse hold it."""
    return float(psutil.Process(pid).create_time())


@pytest.mark.parametrize("start_of", [process_started, wall_clock_start])
async def test_a_task_s_next_run_ends_the_group_a_dead_engine_left_and_spares_a_reused_pid(
        tmp_path: Path, orphan: subprocess.Popen[bytes],
        stranger: subprocess.Popen[bytes], start_of: Callable[[int], float]) -> None:
    executor = ScriptExecutor(tmp_path / "pids")
    agent = AgentSpec(name="a", concurrency=2)
    engine = Engine(tmp_path / "home", rules=[TaskDispatcher(ScriptRun, [agent])],
                    executors=[executor], clock=ManualClock())
    await engine.open()
    try:
        for _ in range(100):  # the leader's own child has started
            if _group(orphan.pid):
                break
            await asyncio.sleep(0.02)
        child = _group(orphan.pid)
        assert child, "the orphan's child did not start"
        board = TaskBoard(engine.events)
        # both back to pending after their engine died mid-run (requeued by an operator)
        for task in ("t-orphaned", "t-reused"):
            await board.create(task, "cut short", prompt="ok")
            await board.assign(task, "a")
            await board.start(task)
            await board.requeue(task, "the engine died")
        await engine.events.append([
            _spawned("t-orphaned", orphan.pid, start_of(orphan.pid)),
            # the pid its run had is another process's now (started later)
            _spawned("t-reused", stranger.pid, start_of(stranger.pid) - 5)])
        await engine.step()
        for task in ("t-orphaned", "t-reused"):
            assert (await board.state(task)).status == "closed"  # type: ignore[union-attr]
        assert orphan.wait(5) is not None
        assert all(not psutil.pid_exists(p) or psutil.Process(p).status() ==
                   psutil.STATUS_ZOMBIE for p in child)
        assert stranger.poll() is None
    finally:
        await engine.close()


@pytest.fixture
def stubborn() -> Iterator[subprocess.Popen[bytes]]:
    """A dead engine's leftover group whose leader ignores SIGTERM: ending it takes the kill
    grace."""
    leader = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
         "signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, start_new_session=True)
    assert leader.stdout is not None and leader.stdout.readline() == b"ready\n"
    yield leader
    leader.kill()
    leader.wait()


async def test_a_shutdown_while_a_run_ends_a_leftover_group_requeues_the_task(
        tmp_path: Path, stubborn: subprocess.Popen[bytes]) -> None:
    policy = DispatchPolicy(requeue_on_failure=False)
    executor = ScriptExecutor(tmp_path / "pids", policy=policy,
                              limits=StreamLimits(kill_grace_s=3.0))
    home = tmp_path / "home"
    engine = Engine(home, rules=[TaskDispatcher(ScriptRun, [AgentSpec(name="a")], policy)],
                    executors=[executor], clock=ManualClock(), drain_timeout=0.3)
    await engine.open()
    try:
        board = TaskBoard(engine.events)
        await board.create("t-1", "cut short", prompt="ok")
        await engine.events.append([_spawned("t-1", stubborn.pid,
                                             psutil.Process(stubborn.pid).create_time())])
        await engine.tick()  # the run is decided
        await engine.start()  # its executor starts ending the leftover group (3 s grace)
        for _ in range(500):
            task = await board.state("t-1")
            if task is not None and task.status == "executing":
                break
            await asyncio.sleep(0.01)
    finally:
        await engine.close()  # the drain ends before the grace: the run is cancelled
    after = Engine(home, clock=ManualClock())
    await after.open()
    try:
        task = await TaskBoard(after.events).state("t-1")
        assert task is not None and task.status == "pending", task
        assert (task.reason or "").startswith("interrupted")
    finally:
        await after.close()


@pytest.fixture
def headless() -> Iterator[tuple[int, float, int]]:
    """A dead engine's leftover group whose leader exited since (and was reaped), leaving a
    child in the group: (the leader's pid, its start time, the child's pid)."""
    leader = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable, "
         "'-c', 'import time; time.sleep(120)']); print(p.pid, flush=True)"],
        stdout=subprocess.PIPE, start_new_session=True)
    started = psutil.Process(leader.pid).create_time()
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    leader.wait()
    leader.stdout.close()
    yield leader.pid, started, child
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)


async def test_a_group_whose_leader_exited_is_still_ended_by_the_next_run(
        tmp_path: Path, headless: tuple[int, float, int]) -> None:
    pid, started, child = headless
    executor = ScriptExecutor(tmp_path / "pids")
    engine = Engine(tmp_path / "home", rules=[TaskDispatcher(ScriptRun, [AgentSpec(name="a")])],
                    executors=[executor], clock=ManualClock())
    await engine.open()
    try:
        assert _group(pid) == [child]
        board = TaskBoard(engine.events)
        await board.create("t-1", "cut short", prompt="ok")
        await engine.events.append([_spawned("t-1", pid, started)])
        await engine.step()
        assert (await board.state("t-1")).status == "closed"  # type: ignore[union-attr]
        assert not _group(pid)
    finally:
        await engine.close()
