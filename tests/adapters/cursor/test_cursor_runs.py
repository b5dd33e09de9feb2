"""The cursor layer running tasks through a real engine (SQLite in tmp_path) and the stand-in
`agent` executable: what each kind of run leaves on the task, and that no process of a run
outlives it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil

from pulse_adapters.cursor import CursorLayer, CursorRun, build_cursor
from pulse_core import Engine, LayerContext, SystemClock, TaskBoard, TaskState
from pulse_core._effects import effect_draft
from tests.adapters.cursor.stand_in import StandIn, settings

TEST_TIME_LIMIT_S = 60


@contextlib.asynccontextmanager
async def cursor_engine(home: Path, config: dict[str, Any], **options: Any
                        ) -> AsyncIterator[tuple[Engine, CursorLayer]]:
    """An opened engine running the cursor layer, its program checked as engine start would
    (ticks and executors left to the test); closed afterwards."""
    cursor = build_cursor(config, LayerContext(home, SystemClock()))
    engine = Engine(home, layers=[cursor.layer], **options)
    await engine.open()
    try:
        await cursor.program(engine)
        yield engine, cursor
    finally:
        await engine.close()


async def task_after_step(engine: Engine, prompt: str = "Fix the failing test") -> TaskState:
    board = TaskBoard(engine.events, origin="human")
    await board.create("t-1", "Fix the test", project="web", prompt=prompt)
    await engine.step()
    task = await board.state("t-1")
    assert task is not None
    return task


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie awaiting its reaper counts as ended)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_a_successful_run_closes_the_task_with_its_result_and_transcript(
        tmp_path: Path, stand_in: StandIn, repo: Path) -> None:
    config = settings(stand_in, repo, model="gpt-5", extra_args=["--force", "--trust"])
    async with cursor_engine(tmp_path / "home", config) as (engine, _):
        task = await task_after_step(engine)
        assert task.status == "closed", task
        assert task.agent == "coder"
        result = task.result
        assert result["result"]["text"] == "Done: the change is made."
        assert result["result"]["subtype"] == "success"
        assert result["result"]["tool_calls"] == 1
        assert result["result"]["cwd"] == str(repo)
        assert result["session"] == result["result"]["session_id"]
        assert result["exit_code"] == 0 and result["duration_ms"] > 0
        transcript = await engine.objects.get(result["transcript"])
    events = [json.loads(line) for line in transcript.decode().splitlines()]
    assert [e["type"] for e in events] == ["system", "user", "assistant", "tool_call",
                                           "tool_call", "assistant", "result"]
    assert events[1]["message"]["content"][0]["text"] == "Fix the failing test"
    (run,) = stand_in.runs()
    assert run["argv"] == [str(stand_in.program), "-p", "--output-format", "stream-json",
                           "--model", "gpt-5", "--force", "--trust", "Fix the failing test"]
    assert run["cwd"] == str(repo)


async def test_a_prompt_that_looks_like_an_option_stays_the_prompt(
        tmp_path: Path, stand_in: StandIn, repo: Path) -> None:
    async with cursor_engine(tmp_path / "home", settings(stand_in, repo)) as (engine, _):
        task = await task_after_step(engine, prompt="--help me fix this")
    assert task.status == "closed"
    (run,) = stand_in.runs()
    assert run["argv"][1:] == ["-p", "--output-format", "stream-json", " --help me fix this"]


async def test_a_non_zero_exit_requeues_the_task_naming_the_exit_and_stderr(
        tmp_path: Path, stand_in: StandIn, repo: Path) -> None:
    stand_in.behave("error", error_result=True, exit_code=3)
    async with cursor_engine(tmp_path / "home", settings(stand_in, repo)) as (engine, _):
        task = await task_after_step(engine)
    assert task.status == "pending" and task.requeues == 1 and task.agent is None
    assert task.reason is not None
    assert "coder: exited with 3" in task.reason
    assert "Error: stand-in failure on demand" in task.reason


async def test_a_run_failing_past_max_requeues_gives_the_task_up(
        tmp_path: Path, stand_in: StandIn, repo: Path) -> None:
    stand_in.behave("error", exit_code=2)
    config = settings(stand_in, repo, policy={"max_requeues": 1})
    async with cursor_engine(tmp_path / "home", config) as (engine, _):
        task = await task_after_step(engine)
        assert task.status == "pending" and task.requeues == 1
        await engine.step()
        board = TaskBoard(engine.events)
        task = await board.state("t-1")  # type: ignore[assignment]
    assert task is not None and task.status == "given-up"
    assert task.reason is not None and "exited with 2" in task.reason
    assert "max_requeues=1" in task.reason
    assert len(stand_in.runs()) == 2


async def test_a_malformed_stream_fails_the_run_naming_the_line(
        tmp_path: Path, stand_in: StandIn, repo: Path) -> None:
    stand_in.behave("malformed")
    config = settings(stand_in, repo, policy={"requeue_on_failure": False})
    async with cursor_engine(tmp_path / "home", config) as (engine, _):
        task = await task_after_step(engine)
    assert task.status == "given-up"
    assert task.reason is not None
    assert "malformed output: stdout line 3 is not JSON" in task.reason


async def test_a_stream_without_a_result_event_fails_the_run(
        tmp_path: Path, stand_in: StandIn, repo: Path) -> None:
    stand_in.behave("no-result")
    config = settings(stand_in, repo, policy={"requeue_on_failure": False})
    async with cursor_engine(tmp_path / "home", config) as (engine, _):
        task = await task_after_step(engine)
    assert task.status == "given-up"
    assert task.reason is not None and "without a `result` event" in task.reason


async def test_an_error_result_with_exit_zero_fails_the_run_with_cursors_words(
        tmp_path: Path, stand_in: StandIn, repo: Path) -> None:
    stand_in.behave("error", error_result=True, exit_code=0)
    config = settings(stand_in, repo, policy={"requeue_on_failure": False})
    async with cursor_engine(tmp_path / "home", config) as (engine, _):
        task = await task_after_step(engine)
    assert task.status == "given-up"
    assert task.reason is not None
    assert "the agent reported an error: result error: the model refused" in task.reason


async def test_a_run_past_its_timeout_is_killed_with_its_grandchild(
        tmp_path: Path, stand_in: StandIn, repo: Path) -> None:
    stand_in.behave("hang")
    config = settings(stand_in, repo, run_timeout_s=1.0)
    began = time.monotonic()
    async with cursor_engine(tmp_path / "home", config) as (engine, _):
        task = await task_after_step(engine)
    took = time.monotonic() - began
    (run,) = stand_in.runs()
    assert gone(run["pid"]) and gone(run["grandchild"])
    assert task.status == "pending" and task.requeues == 1
    assert task.reason is not None and "timed out after 1 s (run_timeout_s)" in task.reason
    assert took < 8, f"the timed-out run took {took:.1f} s to settle"


async def test_a_run_cancelled_by_engine_close_leaves_no_process_and_requeues(
        tmp_path: Path, stand_in: StandIn, repo: Path) -> None:
    stand_in.behave("hang")
    home = tmp_path / "home"
    async with cursor_engine(home, settings(stand_in, repo), drain_timeout=0.2) as (engine, _):
        await TaskBoard(engine.events).create("t-1", "Fix", project="web", prompt="Fix it")
        await engine.start()
        deadline = time.monotonic() + 10
        while not stand_in.runs():
            assert time.monotonic() < deadline, "the engine never started the run"
            await asyncio.sleep(0.05)
    (run,) = stand_in.runs()
    assert gone(run["pid"]) and gone(run["grandchild"])
    async with cursor_engine(home, settings(stand_in, repo)) as (engine, _):
        task = await TaskBoard(engine.events).state("t-1")
    assert task is not None and task.status == "pending" and task.requeues == 1
    assert task.reason is not None and "interrupted" in task.reason


async def test_two_engines_sharing_a_log_run_a_task_once(
        tmp_path: Path, stand_in: StandIn, repo: Path) -> None:
    stand_in.behave("success", delay_s=0.1)  # a slow stream: both engines are at it at once
    store = f"sqlite://{tmp_path / 'shared' / 'events.db'}"
    (tmp_path / "shared").mkdir()
    config = settings(stand_in, repo)
    async with cursor_engine(tmp_path / "a", config, store=store) as (one, _), \
            cursor_engine(tmp_path / "b", config, store=store) as (two, _):
        await TaskBoard(one.events).create("t-1", "Fix", project="web", prompt="Fix it")
        decisions = await asyncio.gather(one.tick(), two.tick())
        runs = [e for d in decisions for e in d.effects if isinstance(e, CursorRun)]
        if len(runs) == 1:  # engine two saw engine one's run first: add the one it could
            # have made, had both ticks read the log before either wrote (the worst race)
            await two.append([effect_draft(runs[0], "rule:cursor-run-dispatcher")])
        await asyncio.gather(one.executor_loop.run_until_idle(),
                             two.executor_loop.run_until_idle())
        task = await TaskBoard(one.events).state("t-1")
        assigned = await one.events.read(key="t-1", kinds=["task-assigned"])
        acked = [e.data["result"] for e in await one.events.read(kinds=["effect-acked"])]
    assert task is not None and task.status == "closed"
    assert len(assigned) == 1
    assert len(stand_in.runs()) == 1
    assert sorted(a["dispatched"] for a in acked) == [False, True]
    (refused,) = [a for a in acked if not a["dispatched"]]
    assert "t-1" in refused["reason"]
