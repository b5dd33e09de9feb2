"""The shared subprocess executor, through a tiny host that runs a Python stand-in script."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pulse_adapters.agents import (
    AgentResult,
    AgentRun,
    AgentSpec,
    AgentStream,
    DispatchPolicy,
    Program,
    ProgramCheck,
    StreamLimits,
    TaskDispatcher,
)
from pulse_core import Engine, ExecutionContext, ManualClock, SystemClock, TaskBoard
from tests.adapters.agents.rig import ScriptExecutor, ScriptRun, gone, stand_in_pids
from tests.write_lock import WriteLock

TEST_TIME_LIMIT_S = 60

AGENT = "coder"


async def _engine(tmp_path: Path, executor: ScriptExecutor, *, agents: int = 1,
                  policy: DispatchPolicy | None = None) -> Engine:
    specs = [AgentSpec(name=f"{AGENT}-{i}" if agents > 1 else AGENT) for i in range(agents)]
    dispatcher = TaskDispatcher(ScriptRun, specs, policy or executor.policy,
                                program=executor.program)
    engine = Engine(tmp_path / "home", rules=[dispatcher], executors=[executor],
                    clock=ManualClock())
    await engine.open()
    return engine


async def _task_events(engine: Engine, task_id: str) -> list[str]:
    return [e.kind for e in await engine.events.read(key=task_id)]


async def test_a_run_that_succeeds_acks_and_closes_its_task_with_the_transcript(
        tmp_path: Path) -> None:
    executor = ScriptExecutor(tmp_path / "pids")
    engine = await _engine(tmp_path, executor)
    try:
        await TaskBoard(engine.events).create("t-1", "say hello", prompt="ok")
        await engine.step()
        assert await _task_events(engine, "t-1") == [
            "task-created", "task-assigned", "task-executing", "task-acked", "task-closed"]
        task = (await engine.snapshot()).projection("tasks")["t-1"]
        assert (task.status, task.agent) == ("closed", AGENT)
        assert task.result["result"] == "did t-1" and task.result["session"] == "s-t-1"
        stream = await engine.objects.get(task.result["transcript"])
        assert b'"type": "result"' in stream and stream.count(b"\n") == 3
        [acked] = await engine.events.read(kinds=["effect-acked"])
        assert acked.data["result"]["ok"] is True and acked.data["result"]["exit_code"] == 0
        origins = {e.origin for e in await engine.events.read(key="t-1")}
        assert origins - {"agent"} == {"executor:ScriptExecutor"}
    finally:
        await engine.close()


async def test_a_non_zero_exit_requeues_then_gives_up_by_the_policy(tmp_path: Path) -> None:
    executor = ScriptExecutor(tmp_path / "pids", policy=DispatchPolicy(max_requeues=1))
    engine = await _engine(tmp_path, executor)
    try:
        await TaskBoard(engine.events).create("t-1", "doomed", prompt="fail")
        await engine.step()   # run 1 fails: requeued
        await engine.step()   # run 2 fails: given up (one requeue allowed)
        await engine.step()   # nothing left to dispatch
        assert await _task_events(engine, "t-1") == [
            "task-created", "task-assigned", "task-executing", "task-requeued",
            "task-assigned", "task-executing", "task-given-up"]
        snapshot = await engine.snapshot()
        task = snapshot.projection("tasks")["t-1"]
        assert task.status == "given-up" and task.requeues == 1
        assert "exited with 3" in task.reason and "the model refused" in task.reason
        assert "max_requeues=1" in task.reason
        stats = snapshot.projection("agent-capability-stats").agents[AGENT]
        assert (stats.requeued, stats.given_up, stats.consecutive_failures) == (1, 1, 2)
        runs = await engine.events.read(kinds=["effect-acked"])
        assert [r.data["result"]["task"] for r in runs] == ["requeued", "given-up"]
        assert not await engine.events.read(kinds=["effect-failed"])
    finally:
        await engine.close()


async def test_malformed_output_and_an_agent_error_fail_the_run_with_the_reason(
        tmp_path: Path) -> None:
    executor = ScriptExecutor(tmp_path / "pids", policy=DispatchPolicy(requeue_on_failure=False))
    engine = await _engine(tmp_path, executor)
    try:
        board = TaskBoard(engine.events)
        await board.create("t-bad", "garbled", prompt="malformed")
        await board.create("t-err", "refused", prompt="error")
        await engine.step()
        await engine.step()
        tasks = (await engine.snapshot()).projection("tasks")
        assert tasks["t-bad"].status == tasks["t-err"].status == "given-up"
        assert "malformed output: stdout line 2 is not JSON" in tasks["t-bad"].reason
        assert "the agent reported an error: no access" in tasks["t-err"].reason
        assert "requeue_on_failure is off" in tasks["t-err"].reason
    finally:
        await engine.close()


async def test_a_run_past_its_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    executor = ScriptExecutor(pids, run_timeout_s=1.0)
    engine = await _engine(tmp_path, executor)
    try:
        await TaskBoard(engine.events).create("t-1", "hang", prompt="hang-quiet")
        await engine.step()
        leader, child = await stand_in_pids(pids)
        assert gone(leader) and gone(child)  # both ignored SIGTERM: SIGKILL after the grace
        task = (await engine.snapshot()).projection("tasks")["t-1"]
        assert task.status == "pending" and task.requeues == 1
        assert "timed out after 1 s (run_timeout_s)" in task.reason
    finally:
        await engine.close()


async def test_cancelling_a_run_kills_its_process_group_and_requeues_the_task(
        tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    executor = ScriptExecutor(pids)
    engine = await _engine(tmp_path, executor)
    try:
        board = TaskBoard(engine.events)
        created = await board.create("t-1", "hang", prompt="hang")
        run = ScriptRun(task_id="t-1", task_version=created.version, agent=AGENT,
                        prompt="hang", project="default")
        ctx = ExecutionContext("e-1", 1, 0, "test", SystemClock(), engine.events)
        running = asyncio.create_task(executor.execute(run, ctx))
        leader, child = await stand_in_pids(pids)
        assert not gone(leader) and not gone(child)
        running.cancel()
        try:
            await running
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the cancelled run returned instead of re-raising")
        assert gone(leader) and gone(child)
        task = await board.state("t-1")
        assert task is not None and task.status == "pending"
        assert task.reason is not None and task.reason.startswith("interrupted")
    finally:
        await engine.close()


async def test_a_missing_program_fails_runs_finally_and_dispatches_nothing_more(
        tmp_path: Path) -> None:
    check = ProgramCheck(Program(field="layers.script.program", argv0="no-such-agent-xyz"),
                         name="script-program")
    executor = ScriptExecutor(tmp_path / "pids", check=check)
    engine = await _engine(tmp_path, executor)
    try:
        await TaskBoard(engine.events).create("t-1", "never", prompt="ok")
        await engine.step()  # dispatched before the check ran; the run fails finally
        await engine.step()  # the check's problem is known now: nothing is dispatched
        [failed] = await engine.events.read(kinds=["effect-failed"])
        assert failed.data["final"] is True
        assert ("layers.script.program: `no-such-agent-xyz` was not found on PATH"
                in failed.data["error"])
        assert len(await engine.events.read(kinds=["effect"])) == 1
        assert (await board_state(engine, "t-1")) == "pending"
    finally:
        await engine.close()


async def board_state(engine: Engine, task_id: str) -> str | None:
    task = await TaskBoard(engine.events).state(task_id)
    return None if task is None else task.status


class BrokenParser(ScriptExecutor):
    """A host whose parser has a bug."""

    def parse(self, run: AgentRun, stream: AgentStream) -> AgentResult:
        return AgentResult(result={"unencodable": object()})


async def test_a_parser_that_fails_settles_the_task_rather_than_leaving_it_executing(
        tmp_path: Path) -> None:
    executor = BrokenParser(tmp_path / "pids", policy=DispatchPolicy(requeue_on_failure=False))
    engine = await _engine(tmp_path, executor)
    try:
        await TaskBoard(engine.events).create("t-1", "parse me", prompt="ok")
        await engine.step()
        task = await TaskBoard(engine.events).state("t-1")
        assert task is not None and task.status == "given-up"
        assert "the output could not be read: TypeError" in (task.reason or "")
    finally:
        await engine.close()


class _KeyedExecutor(ScriptExecutor):
    """A host whose runs may print a secret (here: the task id the stand-in echoes)."""

    def secrets(self, run: AgentRun) -> tuple[str, ...]:
        return ("sk-live-0123456789", "short")


async def test_a_hosts_secrets_never_reach_the_transcript_the_result_or_the_reason(
        tmp_path: Path) -> None:
    executor = _KeyedExecutor(tmp_path / "pids", policy=DispatchPolicy(max_requeues=0))
    engine = await _engine(tmp_path, executor)
    try:
        board = TaskBoard(engine.events)
        await board.create("sk-live-0123456789", "echoes the key", prompt="ok")
        await engine.step()
        task = (await engine.snapshot()).projection("tasks")["sk-live-0123456789"]
        assert task.status == "closed"
        assert task.result["result"] == "did [redacted]"
        assert task.result["session"] == "s-[redacted]"
        transcript = await engine.objects.get(task.result["transcript"])
        assert b"sk-live-0123456789" not in transcript and b"[redacted]" in transcript
        assert executor.redact(ScriptRun(task_id="t", task_version=1, agent="a", prompt="",
                                         project="p"), "short stays") == "short stays"
    finally:
        await engine.close()


EIGHT = "k8-12345"  # a secret of exactly the shortest length redacted


class _EightExecutor(ScriptExecutor):
    """A host whose runs hold a secret of exactly 8 characters, which they print."""

    def env(self, run: AgentRun) -> dict[str, str]:
        return {**super().env(run), "STAND_IN_SECRET": EIGHT}

    def secrets(self, run: AgentRun) -> tuple[str, ...]:
        return (EIGHT, "k7-1234")


async def test_a_secret_of_exactly_8_characters_is_redacted_and_one_of_7_is_not(
        tmp_path: Path) -> None:
    executor = _EightExecutor(tmp_path / "pids", policy=DispatchPolicy(requeue_on_failure=False))
    engine = await _engine(tmp_path, executor)
    try:
        board = TaskBoard(engine.events)
        await board.create("t-ok", "prints the key", prompt="leak")
        await board.create("t-fail", "fails quoting the key", prompt="leak-fail")
        await engine.step()
        await engine.step()
        tasks = (await engine.snapshot()).projection("tasks")
        assert engine.objects is not None
        closed, failed = tasks["t-ok"], tasks["t-fail"]
        assert closed.status == "closed" and closed.result["result"] == "did t-ok with [redacted]"
        transcript = await engine.objects.get(closed.result["transcript"])
        assert b"calling with [redacted]" in transcript and EIGHT.encode() not in transcript
        assert failed.status == "given-up"
        assert "the key [redacted] was refused" in failed.reason and EIGHT not in failed.reason
        stderrs = [a.data["result"]["stderr"] for a in await engine.events.read(
            kinds=["effect-acked"])]
        assert len(stderrs) == 2
        for digest in stderrs:
            tail = await engine.objects.get(digest)
            assert b"the key [redacted] was refused" in tail and EIGHT.encode() not in tail
        run = ScriptRun(task_id="t", task_version=1, agent="a", prompt="", project="p")
        assert executor.redact(run, "k7-1234 stays") == "k7-1234 stays"
    finally:
        await engine.close()


async def test_a_secret_cut_by_an_output_bound_leaves_no_piece_of_it_stored(
        tmp_path: Path) -> None:
    stderr = f"provider: the key {EIGHT} was refused\n".encode()
    first = b'{"type": "system", "subtype": "init", "session_id": "s-t-cut"}\n'
    cut = first + f'{{"type": "assistant", "text": "calling with {EIGHT[:5]}'.encode()
    limits = StreamLimits(kill_grace_s=0.3, stderr_tail_bytes=len(" was refused\n") + 7,
                          max_stdout_bytes=len(cut))
    executor = _EightExecutor(tmp_path / "pids", limits=limits,
                              policy=DispatchPolicy(requeue_on_failure=False))
    engine = await _engine(tmp_path, executor)
    try:
        board = TaskBoard(engine.events)
        await board.create("t-tail", "fails quoting the key", prompt="leak-fail")
        await board.create("t-cut", "prints the key", prompt="leak")
        await engine.step()
        await engine.step()
        assert engine.objects is not None
        tasks = (await engine.snapshot()).projection("tasks")
        acked = {a.data["result"]["transcript"]: a.data["result"] for a in
                 await engine.events.read(kinds=["effect-acked"])}
        stored = [await engine.objects.get(digest) for result in acked.values()
                  for digest in (result["transcript"], result["stderr"]) if digest]
        assert b"[redacted] was refused\n" in stored and stderr[-20:] not in stored
        assert any(s.startswith(first) and s.endswith(b"calling with [redacted]")
                   for s in stored)
        for text in (*stored, *(t.reason.encode() for t in tasks.values())):
            for piece in (EIGHT[-5:], EIGHT[:5]):
                assert piece.encode() not in text, (piece, text)
    finally:
        await engine.close()


class LockedAtTheEnd(ScriptExecutor):
    """Another process takes the log's write lock for `hold_s` as each run ends (before its
    task is moved on)."""

    def __init__(self, pids: Path, db: Path, hold_s: float) -> None:
        super().__init__(pids)
        self.db, self.hold_s = db, hold_s
        self.locks: list[WriteLock] = []

    def parse(self, run: AgentRun, stream: AgentStream) -> AgentResult:
        self.locks.append(WriteLock(self.db, self.hold_s))
        return super().parse(run, stream)


async def test_a_run_that_ends_while_the_store_is_locked_is_recorded_once_it_answers(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "events.db"
    executor = LockedAtTheEnd(tmp_path / "pids", db, hold_s=1.5)
    dispatcher = TaskDispatcher(ScriptRun, [AgentSpec(name=AGENT)], executor.policy,
                                program=executor.program)
    engine = Engine(tmp_path / "home", store=f"sqlite:///{db}?busy_timeout=0.2",
                    rules=[dispatcher], executors=[executor], clock=ManualClock())
    await engine.open()
    try:
        await TaskBoard(engine.events).create("t-1", "say hello", prompt="ok")
        await engine.step()
        assert await _task_events(engine, "t-1") == [
            "task-created", "task-assigned", "task-executing", "task-acked", "task-closed"]
        [acked] = await engine.events.read(kinds=["effect-acked"])
        assert acked.data["result"]["ok"] is True
        assert not await engine.events.read(kinds=["effect-failed"])
        assert len(executor.locks) == 1  # one run
        assert any("task t-1's task-acked: the store cannot take it yet" in r.getMessage()
                   for r in caplog.records)
    finally:
        await engine.close()
        for lock in executor.locks:
            lock.ended()
