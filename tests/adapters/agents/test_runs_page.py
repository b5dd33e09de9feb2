"""A host's runs page (agent_runs_page) in the web UI: each run with its outcome, duration,
exit code, transcript, and the tokens its host reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pulse_adapters.agents import (
    AgentResult,
    AgentRun,
    AgentSpec,
    AgentStream,
    DispatchPolicy,
    TaskDispatcher,
    agent_runs_page,
)
from pulse_adapters.agents._page import reported_tokens
from pulse_core import Engine, Layer, ManualClock, TaskBoard, TaskState
from tests.adapters.agents.rig import ScriptExecutor, ScriptRun
from tests.web.test_rules_api import ui_of

TEST_TIME_LIMIT_S = 60


class UsageExecutor(ScriptExecutor):
    """The stand-in, its result carrying a usage report as Hermes' runs do."""

    def parse(self, run: AgentRun, stream: AgentStream) -> AgentResult:
        done = super().parse(run, stream)
        return AgentResult(result={"response": done.result,
                                   "usage": {"input_tokens": 7, "output_tokens": 2}})


async def test_the_runs_page_shows_each_runs_outcome_duration_transcript_and_tokens(
        tmp_path: Path) -> None:
    executor = UsageExecutor(tmp_path / "pids", policy=DispatchPolicy(max_requeues=0))
    agents = [AgentSpec(name="coder")]
    page = agent_runs_page("script", "Script", ScriptRun, agents)
    async with Engine(tmp_path / "home", clock=ManualClock(), layers=[Layer(
            "script", rules=[TaskDispatcher(ScriptRun, agents, executor.policy,
                                            program=executor.program)],
            executors=[executor], ui=[page])]) as engine:
        board = TaskBoard(engine.events)
        await board.create("t-ok", "say hello", prompt="ok")
        await engine.step()
        await board.create("t-bad", "doomed", prompt="fail")
        await engine.step()
        async with ui_of(engine, has_directory=False) as http:
            shown: dict[str, Any] = (await http.get("/api/pages/script-runs")).json()
    runs = {r["task"]: r for r in shown["runs"]}
    ok, bad = runs["t-ok"], runs["t-bad"]
    assert (ok["outcome"], ok["exit_code"], ok["tokens"]) == (
        "closed", 0, {"input_tokens": 7, "output_tokens": 2})
    assert len(ok["transcript"]) == 64 and ok["duration_ms"] >= 0
    assert (bad["outcome"], bad["exit_code"], bad["tokens"]) == ("given-up", 3, None)
    assert "the model refused" in bad["reason"]
    assert [a["runs"] for a in shown["agents"]] == [2]
    assert {t["id"]: t["requeues"] for t in shown["tasks"]} == {"t-ok": 0, "t-bad": 0}


def test_tokens_belong_only_to_the_run_whose_result_the_task_holds() -> None:
    closed = TaskState("t-1", "say hello", "", "ok", 0, "closed", 6, 0, agent="coder", result={
        "transcript": "a" * 64, "result": {"usage": {"input_tokens": 7, "completed": True}}})
    assert reported_tokens(closed, "a" * 64) == {"input_tokens": 7}
    assert reported_tokens(closed, "b" * 64) is None  # an earlier, requeued run of the task
    assert reported_tokens(closed, None) is None
    assert reported_tokens(None, "a" * 64) is None
