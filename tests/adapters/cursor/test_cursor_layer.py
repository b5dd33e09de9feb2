"""The cursor layer as config.json builds it: its settings and their errors, the entry point,
the program check at engine start, and what the stream parser makes of Cursor's events."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from pulse_adapters.agents import AgentOutputError, AgentStream
from pulse_adapters.cursor import (
    CursorExecutor,
    CursorRun,
    CursorSettingsError,
    build_cursor,
    load_settings,
    parse_stream,
)
from pulse_core import Engine, LayerContext, SystemClock, TaskBoard, load_layer
from tests.adapters.cursor.stand_in import StandIn, settings

TEST_TIME_LIMIT_S = 30


def context(tmp_path: Path) -> LayerContext:
    return LayerContext(tmp_path / "home", SystemClock())


def refusal(config: object) -> str:
    with pytest.raises(CursorSettingsError) as caught:
        load_settings(config)
    return str(caught.value)


def test_config_json_builds_the_layer_through_the_entry_point(
        tmp_path: Path, stand_in: StandIn, repo: Path) -> None:
    config = json.loads(json.dumps({"layers": {"cursor": settings(stand_in, repo)}}))
    layer = load_layer("cursor", config["layers"]["cursor"], context(tmp_path))
    assert layer.name == "cursor"
    assert [r.name for r in layer.rules] == ["cursor-run-dispatcher"]  # type: ignore[attr-defined]
    (executor,) = layer.executors
    assert isinstance(executor, CursorExecutor)
    assert executor.run_timeout_s == 10.0 and executor.timeout > executor.run_timeout_s
    assert [s.name for s in layer.services] == ["cursor-program"]  # type: ignore[attr-defined]


def test_defaults_are_the_documented_ones(repo: Path) -> None:
    valid = load_settings({"agents": [{"name": "coder", "repo": str(repo)}]})
    assert (valid.program, valid.model, valid.run_timeout_s, valid.extra_args) == (
        "agent", None, 1800.0, ())
    assert valid.agents[0].projects == ("*",) and valid.agents[0].concurrency == 1
    assert (valid.policy.stuck_after_s, valid.policy.max_requeues,
            valid.policy.requeue_on_failure) == (3600.0, 2, True)


def test_a_repo_that_is_not_a_folder_is_refused_naming_the_agent(tmp_path: Path) -> None:
    afile = tmp_path / "file.txt"
    afile.write_text("x")
    message = refusal({"agents": [{"name": "coder", "repo": str(afile)}]})
    assert "`layers.cursor.agents[0].repo` of agent 'coder'" in message
    assert "is not a folder" in message
    message = refusal({"agents": [{"name": "web", "repo": str(tmp_path / "nowhere")}]})
    assert "agent 'web'" in message and "does not exist" in message
    assert "must be an absolute path" in refusal({"agents": [{"name": "c", "repo": "rel"}]})


@pytest.mark.parametrize(("change", "words"), [
    ({"prgram": "agent"}, "unknown field `prgram` (did you mean `program`?)"),
    ({"run_timeout_s": 0}, "`layers.cursor.run_timeout_s` must be > 0 seconds"),
    ({"run_timeout_s": "long"}, "`layers.cursor.run_timeout_s` is wrong"),
    ({"model": " "}, "`layers.cursor.model` must name a model"),
    ({"program": ""}, "`layers.cursor.program` must name the Cursor CLI"),
    ({"extra_args": ["--api-key", "k"]}, "`layers.cursor.extra_args` may not hold --api-key"),
    ({"extra_args": ["--output-format=json"]}, "may not hold --output-format"),
    ({"policy": {"max_requeues": -1}}, "`layers.cursor.policy.max_requeues` must be >= 0"),
    ({"agents": []}, "`layers.cursor.agents` must list at least one agent"),
])
def test_a_wrong_setting_is_refused_naming_its_field(
        repo: Path, change: dict[str, object], words: str) -> None:
    config = {"agents": [{"name": "coder", "repo": str(repo)}], **change}
    assert words in refusal(config)


def test_agent_names_must_be_unique_and_settings_an_object(repo: Path) -> None:
    twice = [{"name": "coder", "repo": str(repo)}, {"name": "coder", "repo": str(repo)}]
    assert "repeated: coder" in refusal({"agents": twice})
    assert "needs settings" in refusal(None)
    assert "must be a JSON object" in refusal(["agents"])


def test_an_unknown_field_inside_an_agent_is_refused(repo: Path) -> None:
    message = refusal({"agents": [{"name": "coder", "repo": str(repo), "folder": "x"}]})
    assert "unknown field `folder`" in message and "agents[0]" in message


def test_the_command_line_without_a_model_or_extra_args(
        tmp_path: Path, stand_in: StandIn, repo: Path) -> None:
    cursor = build_cursor(settings(stand_in, repo), context(tmp_path))
    run = CursorRun(task_id="t", task_version=1, agent="coder", prompt="Do it", project="web")
    assert list(cursor.executor.argv(run, "/bin/agent")) == [
        "/bin/agent", "-p", "--output-format", "stream-json", "Do it"]
    assert cursor.executor.cwd(run) == repo
    gone = CursorRun(task_id="t", task_version=1, agent="old", prompt="x", project="web")
    with pytest.raises(CursorSettingsError, match="has no agent 'old'"):
        cursor.executor.cwd(gone)


async def test_a_missing_program_is_an_error_at_engine_start_and_the_engine_ticks_on(
        tmp_path: Path, stand_in: StandIn, repo: Path) -> None:
    config = settings(stand_in, repo, program="cursor-agent-not-installed")
    cursor = build_cursor(config, context(tmp_path))
    engine = Engine(tmp_path / "home", layers=[cursor.layer], default_tick_ms=50)
    await engine.open()
    try:
        await TaskBoard(engine.events).create("t-1", "Fix", project="web", prompt="Fix")
        await engine.start()
        deadline = time.monotonic() + 10
        while not (errors := await engine.events.read(key="service:cursor-program")):
            assert time.monotonic() < deadline, "no error recorded for the missing program"
            await asyncio.sleep(0.05)
        ticks = engine.ticks
        while engine.ticks < ticks + 3:
            assert time.monotonic() < deadline, "the engine stopped ticking"
            await asyncio.sleep(0.05)
        task = await TaskBoard(engine.events).state("t-1")
        errors = await engine.events.read(key="service:cursor-program")
    finally:
        await engine.close()
    (error,) = errors
    assert error.data["type"] == "ProgramUnavailable"
    assert error.data["message"].startswith(
        "layers.cursor.program: `cursor-agent-not-installed` was not found on PATH")
    assert "install the Cursor CLI" in error.data["message"]
    assert task is not None and task.status == "pending"
    assert stand_in.runs() == []


async def test_a_program_too_old_is_refused_with_both_versions(
        tmp_path: Path, repo: Path) -> None:
    old = tmp_path / "old-agent"
    old.write_text("#!/bin/sh\necho 2025.08.01-abc1234\n")
    old.chmod(0o755)
    cursor = build_cursor({"program": str(old), "agents": [{"name": "c", "repo": str(repo)}]},
                          context(tmp_path))
    status = await cursor.program.check()
    assert status.problem == (
        "layers.cursor.program: old-agent 2025.08.01 is older than 2025.10.22 — upgrade it "
        "(install the Cursor CLI (curl https://cursor.com/install -fsS | bash)), or set "
        "layers.cursor.program to a newer one")


def stream(*events: object, raw: str | None = None) -> AgentStream:
    lines = [json.dumps(e) for e in events] + ([raw] if raw is not None else [])
    return AgentStream(tuple(lines), "", 0)


INIT = {"type": "system", "subtype": "init", "session_id": "s-1", "model": "Auto",
        "cwd": "/r"}


def test_the_parser_reads_the_final_result_and_counts_the_work() -> None:
    parsed = parse_stream(stream(
        INIT, {"type": "thinking", "subtype": "delta", "text": "hm"},
        {"type": "assistant", "message": {"content": [{"type": "text", "text": "a"}]}},
        {"type": "tool_call", "subtype": "started", "call_id": "c\n1"},
        {"type": "tool_call", "subtype": "completed", "call_id": "c\n1"},
        {"type": "result", "subtype": "success", "is_error": False, "duration_ms": 9,
         "duration_api_ms": 8, "result": "all done", "session_id": "s-1"}))
    assert parsed.ok and parsed.session == "s-1"
    assert parsed.result == {"text": "all done", "subtype": "success", "session_id": "s-1",
                             "model": "Auto", "cwd": "/r", "request_id": None,
                             "duration_ms": 9, "duration_api_ms": 8,
                             "assistant_messages": 1, "tool_calls": 1}


def test_the_parser_refuses_what_breaks_the_protocol() -> None:
    with pytest.raises(AgentOutputError, match="stdout line 2 is not JSON"):
        parse_stream(stream(INIT, raw='{"type": '))
    with pytest.raises(AgentOutputError, match="event 2 has no `type`"):
        parse_stream(stream(INIT, {"subtype": "x"}))
    with pytest.raises(AgentOutputError, match="without a `result` event after 1 lines"):
        parse_stream(stream(INIT))


def test_an_error_result_is_not_ok_and_says_why() -> None:
    parsed = parse_stream(stream(INIT, {"type": "result", "subtype": "error",
                                        "is_error": True, "result": "quota exceeded"}))
    assert not parsed.ok and parsed.error == "result error: quota exceeded"
    assert parsed.session == "s-1"
