"""Attacks on the shared agent parts: processes that escape their group and hold the pipes,
output floods, cancellation and store failures at the end of a run, lines cut at the bounds,
program checks that blow up, and settings no run could honour."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from pulse_adapters.agents import (
    AgentOutputError,
    AgentRun,
    AgentSpec,
    AgentStream,
    DispatchPolicy,
    Program,
    ProgramCheck,
    StreamLimits,
    TaskDispatcher,
)
from pulse_adapters.agents._process import run_process
from pulse_core import (
    Effect,
    Engine,
    EventDraft,
    ExecutionContext,
    ManualClock,
    StoreUnavailable,
    SystemClock,
    TaskBoard,
)
from tests.adapters.agents.rig import ScriptExecutor, ScriptRun

TEST_TIME_LIMIT_S = 30


class CodeRun(AgentRun, tag="code-run"):
    """A run whose prompt is the Python code the "agent" runs."""


class CodeExecutor(ScriptExecutor):
    """Runs `python -c <prompt>`: each test writes its own misbehaving agent."""

    handles: ClassVar[tuple[type[Effect], ...]] = (CodeRun,)

    def argv(self, run: AgentRun, program: str) -> Sequence[str]:
        return [program, "-c", run.prompt]


RESULT = "print('{\"type\": \"result\", \"result\": \"done\"}', flush=True)\n"

ESCAPE = """
import os, subprocess, sys, time
# a helper that leaves the run's process group, keeping the inherited stdout and stderr
helper = subprocess.Popen([sys.executable, '-c',
                           'import os, time; os.setsid(); time.sleep(20)'])
while os.getsid(helper.pid) != helper.pid:  # out of the group before anything is killed
    time.sleep(0.01)
open(os.environ['STAND_IN_PIDS'], 'w').write(f'{helper.pid}\\n')
"""


@contextlib.asynccontextmanager
async def _engine(tmp_path: Path, executor: ScriptExecutor, run_type: type[AgentRun] = CodeRun,
                  **options: Any) -> AsyncIterator[Engine]:
    dispatcher = TaskDispatcher(run_type, [AgentSpec(name="coder")], executor.policy,
                                program=executor.program)
    engine = Engine(tmp_path / "home", rules=[dispatcher], executors=[executor],
                    clock=options.pop("clock", ManualClock()), **options)
    await engine.open()
    try:
        yield engine
    finally:
        await engine.close()


def _kill_escaped(pids: Path) -> None:
    if pids.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pids.read_text().split()[0]), signal.SIGKILL)


# -- a process that left the group keeps the pipes open ---------------------------------------


async def test_an_escaped_helper_holding_stdout_neither_hangs_nor_times_out_a_finished_run(
        tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    executor = CodeExecutor(pids, run_timeout_s=10.0)  # two Python starts, on a busy machine
    try:
        async with _engine(tmp_path, executor) as engine:
            board = TaskBoard(engine.events)
            await board.create("t-1", "escape", prompt=ESCAPE + RESULT)
            began = time.monotonic()
            await asyncio.wait_for(engine.step(), 15)
            # the run's starts, then DRAIN_S (1 s) for the pipes; not held until the helper
            # lets go (20 s)
            assert time.monotonic() - began < 6
            task = await board.state("t-1")
            assert task is not None and task.status == "closed", task.reason
            assert task.result["result"] == "done"
    finally:
        _kill_escaped(pids)


async def test_an_escaped_helper_does_not_stretch_a_hung_run_past_its_timeout(
        tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    executor = CodeExecutor(pids, run_timeout_s=1.0)
    try:
        async with _engine(tmp_path, executor) as engine:
            board = TaskBoard(engine.events)
            await board.create("t-1", "escape and hang",
                               prompt=ESCAPE + "import time\ntime.sleep(30)\n")
            began = time.monotonic()
            await asyncio.wait_for(engine.step(), 15)
            # 1 s of timeout, the kill, then DRAIN_S (1 s) for the pipes; not stretched until
            # the helper lets go (20 s) nor by waiting GONE_WITHIN_S (10 s) for it
            assert time.monotonic() - began < 6
            task = await board.state("t-1")
            assert task is not None and task.status == "pending"
            assert "timed out after 1 s" in (task.reason or "")
    finally:
        _kill_escaped(pids)


async def test_cancelling_a_run_whose_helper_escaped_does_not_hang(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    executor = CodeExecutor(pids)
    try:
        async with _engine(tmp_path, executor) as engine:
            board = TaskBoard(engine.events)
            created = await board.create("t-1", "escape", prompt="")
            run = CodeRun(task_id="t-1", task_version=created.version, agent="coder",
                          prompt=ESCAPE + "import time\ntime.sleep(30)\n", project="default")
            ctx = ExecutionContext("e-1", 1, 0, "test", SystemClock(), engine.events)
            running = asyncio.create_task(executor.execute(run, ctx))
            for _ in range(500):
                if pids.exists() and pids.read_text().endswith("\n"):
                    break
                await asyncio.sleep(0.01)
            began = time.monotonic()
            running.cancel()
            done, _ = await asyncio.wait([running], timeout=5)
            assert done and running.cancelled()
            assert time.monotonic() - began < 3  # not held until the helper lets go
            task = await board.state("t-1")
            assert task is not None and task.status == "pending"
    finally:
        _kill_escaped(pids)


# -- floods -----------------------------------------------------------------------------------


async def test_a_flood_of_empty_lines_is_bounded_and_does_not_stall_the_loop() -> None:
    code = ("import sys\nsys.stdout.buffer.write(b'\\n' * 8_000_000)\n"
            "sys.stdout.buffer.write(b'x\\n' * 2_000_000)\nsys.stdout.flush()\n")
    worst = 0.0  # the most CPU time the loop's thread spent elsewhere between two probes

    async def probe() -> None:  # CPU time, not wall: a busy machine's pauses are not stalls
        nonlocal worst
        while True:
            began = time.thread_time()
            await asyncio.sleep(0.005)
            worst = max(worst, time.thread_time() - began)

    watching = asyncio.create_task(probe())
    began = time.monotonic()
    try:
        outcome = await run_process([sys.executable, "-c", code], cwd=None, env={},
                                    timeout_s=20, limits=StreamLimits())
    finally:
        watching.cancel()
    assert time.monotonic() - began < 4
    assert outcome.truncated and outcome.exit_code == 0
    assert len(outcome.lines) <= StreamLimits().max_lines
    assert len(outcome.stdout) == 12_000_000  # the transcript keeps every byte within its bound
    assert worst < 0.1  # the whole flood fed in one go costs the loop 0.2 s


async def test_binary_garbage_and_bad_utf_8_are_read_without_failing(tmp_path: Path) -> None:
    code = ("import os, sys\nsys.stdout.buffer.write(os.urandom(300_000) + b'\\xff\\xfe\\n')\n"
            "sys.stdout.buffer.write(b'\\xc3\\n')\n" + RESULT)
    executor = CodeExecutor(tmp_path / "pids", policy=DispatchPolicy(requeue_on_failure=False))
    async with _engine(tmp_path, executor) as engine:
        board = TaskBoard(engine.events)
        await board.create("t-1", "garbage", prompt=code)
        await engine.step()
        task = await board.state("t-1")
        assert task is not None and task.status == "given-up"
        assert "malformed output" in (task.reason or "")
        msgspec.json.encode(task.reason)


# -- lines cut at the bounds ------------------------------------------------------------------


async def test_a_line_cut_at_max_line_bytes_does_not_fail_a_run_that_succeeded(
        tmp_path: Path) -> None:
    big = ("import json\nprint(json.dumps({'type': 'tool_call', 'output': 'x' * 3_000}), "
           "flush=True)\n")
    executor = CodeExecutor(tmp_path / "pids", limits=StreamLimits(max_line_bytes=1_000,
                                                                 kill_grace_s=0.3))
    async with _engine(tmp_path, executor) as engine:
        board = TaskBoard(engine.events)
        await board.create("t-1", "big tool output", prompt=big + RESULT)
        await engine.step()
        task = await board.state("t-1")
        assert task is not None and task.status == "closed", task.reason
        [acked] = [a for a in await engine.events.read(kinds=["effect-acked"])]
        assert acked.data["result"]["truncated"] is True


def test_json_lines_skips_lines_cut_at_a_bound_and_names_real_garbage() -> None:
    stream = AgentStream(('{"a": 1}', '{"cut": "xxxx', '{"b": 2}'), "", 0, True,
                         cut_lines=(2,))
    assert stream.json_lines() == [{"a": 1}, {"b": 2}]
    with pytest.raises(AgentOutputError, match="line 2 is not JSON"):
        AgentStream(('{"a": 1}', '{"cut": "xxxx'), "", 0).json_lines()


def test_json_nested_past_the_parser_depth_is_an_output_error() -> None:
    with pytest.raises(AgentOutputError, match="line 1"):
        AgentStream(("[" * 100_000,), "", 0).json_lines()


# -- the end of a run: cancellation, and a store that refuses a write --------------------------


async def test_a_run_cancelled_while_its_outcome_is_recorded_still_records_it(
        tmp_path: Path) -> None:
    executor = ScriptExecutor(tmp_path / "pids")
    async with _engine(tmp_path, executor, ScriptRun) as engine:
        assert engine.objects is not None
        board = TaskBoard(engine.events)
        created = await board.create("t-1", "slow to store", prompt="ok")
        storing = asyncio.Event()
        put = engine.objects.put

        async def slow_put(data: bytes) -> str:
            storing.set()
            await asyncio.sleep(0.5)
            return await put(data)

        engine.objects.put = slow_put  # type: ignore[method-assign]
        run = ScriptRun(task_id="t-1", task_version=created.version, agent="coder",
                        prompt="ok", project="default")
        ctx = ExecutionContext("e-1", 1, 0, "test", SystemClock(), engine.events)
        running = asyncio.create_task(executor.execute(run, ctx))
        await asyncio.wait_for(storing.wait(), 10)
        running.cancel()  # the agent has finished its work: it must not be run again
        with contextlib.suppress(asyncio.CancelledError):
            await running
        task = await board.state("t-1")
        assert task is not None and task.status == "closed"


class _RefusesClose:
    """An event store whose append of a task-closed is refused once as unavailable."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.refused = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append(self, drafts: Sequence[EventDraft], expect: Any = None) -> Any:
        if not self.refused and any(d.kind == "task-closed" for d in drafts):
            self.refused = True
            raise StoreUnavailable("database is locked")
        return await self._inner.append(drafts, expect)


async def test_a_store_refusing_the_close_leaves_no_task_acked_for_ever(tmp_path: Path) -> None:
    executor = ScriptExecutor(tmp_path / "pids")
    async with _engine(tmp_path, executor, ScriptRun) as engine:
        board = TaskBoard(engine.events)
        created = await board.create("t-1", "closing", prompt="ok")
        run = ScriptRun(task_id="t-1", task_version=created.version, agent="coder",
                        prompt="ok", project="default")
        events = _RefusesClose(engine.events)
        ctx = ExecutionContext("e-1", 1, 0, "test", SystemClock(), events)  # type: ignore[arg-type]
        with contextlib.suppress(StoreUnavailable):
            await executor.execute(run, ctx)
        task = await board.state("t-1")
        # executing is taken back by the stuck timeout; acked with no close would stay so
        assert task is not None and task.status in ("closed", "executing"), task.status


async def test_ack_and_close_are_one_append(tmp_path: Path) -> None:
    executor = ScriptExecutor(tmp_path / "pids")
    async with _engine(tmp_path, executor, ScriptRun) as engine:
        await TaskBoard(engine.events).create("t-1", "one step", prompt="ok")
        await engine.step()
        acked, closed = [e for e in await engine.events.read(key="t-1")
                         if e.kind in ("task-acked", "task-closed")]
        assert acked.seq + 1 == closed.seq
        assert acked.tx == closed.tx


# -- the program check ------------------------------------------------------------------------


def _program(tmp_path: Path, version_output: str) -> Path:
    program = tmp_path / "agent"
    program.write_text(f"#!{sys.executable}\nprint({version_output!r})\n", encoding="utf-8")
    program.chmod(0o755)
    return program


async def test_a_check_that_blows_up_is_a_problem_not_a_dispatch_loop(tmp_path: Path) -> None:
    program = _program(tmp_path, "agent 1." + "9" * 5_000)  # past int()'s digit limit
    check = ProgramCheck(Program(field="layers.script.program", argv0=str(program),
                                 min_version="1.0"), name="script-program")
    status = await check.check()
    assert status.problem is not None and "layers.script.program" in status.problem
    executor = ScriptExecutor(tmp_path / "pids", check=check)
    async with _engine(tmp_path, executor, ScriptRun) as engine:
        await check(engine)
        await TaskBoard(engine.events).create("t-1", "never", prompt="ok")
        for _ in range(3):
            await engine.step()
        assert not await engine.events.read(kinds=["effect"])
        [error] = await engine.events.read(kinds=["error"])
        assert error.key == "service:script-program"


# -- settings no run could honour -------------------------------------------------------------


@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0])
def test_a_policy_or_timeout_that_is_not_a_finite_positive_time_is_refused(
        tmp_path: Path, value: float) -> None:
    with pytest.raises(ValueError, match="stuck_after_s"):
        DispatchPolicy(stuck_after_s=value)
    with pytest.raises(ValueError, match="run_timeout_s"):
        ScriptExecutor(tmp_path / "pids", run_timeout_s=value)
    with pytest.raises(ValueError, match="kill_grace_s"):
        StreamLimits(kill_grace_s=value)


@pytest.mark.parametrize("field", ["max_line_bytes", "max_stdout_bytes", "stderr_tail_bytes",
                                   "max_lines"])
def test_stream_limits_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        StreamLimits(**{field: 0})


# -- what held --------------------------------------------------------------------------------


async def test_a_requeue_racing_a_late_finish_leaves_the_task_pending(tmp_path: Path) -> None:
    executor = ScriptExecutor(tmp_path / "pids")
    async with _engine(tmp_path, executor, ScriptRun) as engine:
        board = TaskBoard(engine.events)
        created = await board.create("t-1", "slow", prompt="slow")
        run = ScriptRun(task_id="t-1", task_version=created.version, agent="coder",
                        prompt="slow", project="default")
        ctx = ExecutionContext("e-1", 1, 0, "test", SystemClock(), engine.events)
        running = asyncio.create_task(executor.execute(run, ctx))
        for _ in range(500):
            task = await board.state("t-1")
            if task is not None and task.status == "executing":
                break
            await asyncio.sleep(0.01)
        await board.requeue("t-1", "taken back by hand")
        result = await running
        assert result["task"] == "moved-on"
        task = await board.state("t-1")
        assert task is not None and task.status == "pending" and task.requeues == 1
        again = await executor.execute(run, ctx)  # the operator retries the old run
        assert again["dispatched"] is False


async def test_a_restart_between_assign_and_run_never_runs_the_task_twice(
        tmp_path: Path) -> None:
    executor = ScriptExecutor(tmp_path / "pids")
    async with _engine(tmp_path, executor, ScriptRun) as engine:
        board = TaskBoard(engine.events)
        created = await board.create("t-1", "crashy", prompt="ok")
        await board.assign("t-1", "coder", expect_version=created.version)  # then "crashed"
        run = ScriptRun(task_id="t-1", task_version=created.version, agent="coder",
                        prompt="ok", project="default")
        ctx = ExecutionContext("e-1", 2, 0, "test", SystemClock(), engine.events)
        assert (await executor.execute(run, ctx))["dispatched"] is False
        assert not (tmp_path / "pids").exists()
