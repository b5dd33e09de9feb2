"""`upulse runs`: each agent task's runs read from a real home an engine ran tasks in, and
`--transcript` printing what a run wrote; the same view on the hosts' pages (run_view)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

from pulse_adapters.agents import (
    AgentResult,
    AgentRun,
    AgentSpec,
    AgentStream,
    DispatchPolicy,
    TaskDispatcher,
    is_agent_run,
    run_view,
)
from pulse_cli.queries import read_effects, task_states
from pulse_core import Engine, ManualClock, SqliteEventStore, TaskBoard
from tests.adapters.agents.rig import ScriptExecutor, ScriptRun
from tests.cli.runner import Upulse

TEST_TIME_LIMIT_S = 90
USAGE = {"input_tokens": 120, "output_tokens": 33, "completed": True, "api_calls": 2}


class UsageExecutor(ScriptExecutor):
    """The stand-in, its result carrying a usage report as Hermes' runs do."""

    def parse(self, run: AgentRun, stream: AgentStream) -> AgentResult:
        done = super().parse(run, stream)
        return AgentResult(result={"response": done.result, "usage": USAGE},
                           session=done.session)


async def ran(home: Path, pids: Path) -> None:
    """t-ok closes on its one run; t-bad fails twice (requeued, then given up)."""
    executor = UsageExecutor(pids, policy=DispatchPolicy(max_requeues=1))
    dispatcher = TaskDispatcher(ScriptRun, [AgentSpec(name="coder")], executor.policy,
                                program=executor.program)
    engine = Engine(home, rules=[dispatcher], executors=[executor], clock=ManualClock())
    await engine.open()
    try:
        board = TaskBoard(engine.events)
        await board.create("t-ok", "say hello", prompt="ok")
        await engine.step()
        await board.create("t-bad", "doomed", prompt="fail")
        await engine.step()
        await engine.step()
    finally:
        await engine.close()


def fingerprint(home: Path) -> dict[str, str]:
    return {str(p.relative_to(home)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(home.rglob("*")) if p.is_file()}


def test_runs_lists_each_tasks_runs_and_prints_a_transcript(upulse: Upulse,
                                                            tmp_path: Path) -> None:
    home = tmp_path / "home"
    asyncio.run(ran(home, tmp_path / "pids"))
    before = fingerprint(home)
    listed: Any = upulse.json("runs", "--home", home)
    assert [(t["task"], t["status"], t["agent"], t["requeues"], len(t["runs"]))
            for t in listed] == [("t-ok", "closed", "coder", 0, 1),
                                 ("t-bad", "given-up", "coder", 1, 2)]
    (ok,) = listed[0]["runs"]
    assert (ok["type"], ok["agent"], ok["status"], ok["outcome"], ok["exit_code"]) == (
        "script-run", "coder", "acked", "closed", 0)
    assert ok["tokens"] == {"input_tokens": 120, "output_tokens": 33}
    assert ok["started_at"] is not None and ok["duration_ms"] >= 0
    assert ok["session"] == "s-t-ok" and len(ok["transcript"]) == 64
    first, second = listed[1]["runs"]
    assert [(r["outcome"], r["exit_code"], r["tokens"]) for r in (first, second)] == [
        ("requeued", 3, None), ("given-up", 3, None)]
    assert "the model refused" in first["reason"]

    table = upulse("runs", "--home", home).stdout.splitlines()
    assert table[0].split() == ["TASK", "RUN", "TYPE", "AGENT", "STATE", "STARTED", "TOOK",
                                "EXIT", "REQUEUES", "TOKENS", "TRANSCRIPT"]
    assert [line.split()[0] for line in table[1:]] == ["t-ok", "t-bad", "t-bad"]
    assert "input 120, output 33" in table[1] and ok["transcript"][:12] in table[1]
    assert "acked, task given-up" in table[3]

    only: Any = upulse.json("runs", "--task", "t-bad", "--home", home)
    assert [t["task"] for t in only] == ["t-bad"]
    assert upulse.json("runs", "--agent", "nobody", "--home", home) == []
    missing = upulse("runs", "--task", "t-okk", "--home", home, ok=False)
    assert missing.returncode == 1 and "did you mean 't-ok'?" in missing.stderr

    stream = upulse("runs", "--transcript", ok["id"], "--home", home).stdout
    assert '"type": "result"' in stream and stream.count("\n") == 3
    by_hash = upulse("runs", "--transcript", ok["transcript"][:12], "--home", home).stdout
    assert by_hash == stream
    unknown = upulse("runs", "--transcript", "nope", "--home", home, ok=False)
    assert unknown.returncode == 1 and "no agent run 'nope'" in unknown.stderr
    assert fingerprint(home) == before  # read-only: not one byte written


def test_a_home_without_runs_says_which_layers_run_tasks(upulse: Upulse,
                                                         tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    assert upulse("runs", "--home", home).stdout.startswith("no agent runs in this home")


async def test_tokens_are_those_of_the_run_whose_result_the_task_holds(tmp_path: Path) -> None:
    home = tmp_path / "home"
    await ran(home, tmp_path / "pids")
    store = await SqliteEventStore.open(home / "events.db", read_only=True)
    try:
        tasks = await task_states(store)
        entries = [e for e in (await read_effects(store)).values() if is_agent_run(e)]
    finally:
        await store.close()
    assert sorted(e.tag for e in entries) == ["script-run"] * 3
    views = {v.task: v for v in (run_view(e, tasks[e.body["task_id"]]) for e in entries)}
    assert views["t-ok"].tokens == {"input_tokens": 120, "output_tokens": 33}
    assert views["t-bad"].tokens is None
    assert run_view(entries[0]).tokens is None  # without its task: nothing to report
