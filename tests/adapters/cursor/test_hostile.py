"""Attacks on the cursor layer: settings no run could honour, and streams off the protocol
from an `agent` that answers `--version` properly (a huge tool-call line, garbage, nesting)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

from pulse_adapters.agents import AgentOutputError, AgentStream
from pulse_adapters.cursor import CursorSettingsError, build_cursor, load_settings, parse_stream
from pulse_core import Engine, LayerContext, SystemClock, TaskBoard

TEST_TIME_LIMIT_S = 30

INIT = {"type": "system", "subtype": "init", "session_id": "s-1", "model": "Auto"}
RESULT = {"type": "result", "subtype": "success", "is_error": False, "result": "Done.",
          "session_id": "s-1"}


def _agent(folder: Path, body: str) -> Path:
    """An `agent` that prints a recent version and, when run, executes `body`."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "agent"
    program.write_text(f"#!{sys.executable}\nimport json, sys\n"
                       "if sys.argv[1:] == ['--version']:\n"
                       "    print('2026.02.13-41ac335')\n    sys.exit(0)\n"
                       f"INIT, RESULT = {INIT!r}, {RESULT!r}\n{body}", encoding="utf-8")
    program.chmod(0o755)
    return program


def _config(program: Path, repo: Path, **more: Any) -> dict[str, Any]:
    return {"program": str(program), "agents": [{"name": "coder", "repo": str(repo)}],
            "run_timeout_s": 10.0, **more}


@pytest.mark.parametrize("value", [math.inf, -math.inf])
def test_a_run_timeout_that_is_not_finite_is_a_typed_error_naming_the_field(
        tmp_path: Path, value: float) -> None:
    with pytest.raises(CursorSettingsError, match=r"`layers\.cursor\.run_timeout_s`"):
        load_settings({"agents": [{"name": "coder", "repo": str(tmp_path)}],
                       "run_timeout_s": value})


def test_a_stuck_after_that_is_not_finite_is_a_typed_error_naming_the_field(
        tmp_path: Path) -> None:
    with pytest.raises(CursorSettingsError,
                       match=r"`layers\.cursor\.policy\.stuck_after_s` must be a finite"):
        load_settings({"agents": [{"name": "coder", "repo": str(tmp_path)}],
                       "policy": {"stuck_after_s": math.inf}})


async def _run(tmp_path: Path, body: str, **more: Any) -> Any:
    repo = tmp_path / "repo"
    repo.mkdir()
    config = _config(_agent(tmp_path / "bin", body), repo, **more)
    cursor = build_cursor(config, LayerContext(tmp_path / "home", SystemClock()))
    engine = Engine(tmp_path / "home", layers=[cursor.layer])
    await engine.open()
    try:
        await cursor.program(engine)
        board = TaskBoard(engine.events, origin="human")
        await board.create("t-1", "Fix it", prompt="Fix the failing test")
        await engine.step()
        return await board.state("t-1")
    finally:
        await engine.close()


async def test_a_tool_call_line_past_max_line_bytes_does_not_fail_a_successful_run(
        tmp_path: Path) -> None:
    body = ("print(json.dumps(INIT), flush=True)\n"
            "print(json.dumps({'type': 'tool_call', 'subtype': 'completed', 'tool_call': "
            "{'readToolCall': {'result': {'success': {'content': 'x' * 1_500_000}}}}}), "
            "flush=True)\n"
            "print(json.dumps(RESULT), flush=True)\n")
    task = await _run(tmp_path, body)
    assert task is not None and task.status == "closed", task.reason
    assert task.result["result"]["text"] == "Done."


async def test_garbage_between_events_fails_the_run_with_the_line_named(tmp_path: Path) -> None:
    body = ("print(json.dumps(INIT), flush=True)\n"
            "sys.stdout.buffer.write(b'\\xff\\xfe\\x00garbage\\n')\n"
            "print(json.dumps(RESULT), flush=True)\n")
    task = await _run(tmp_path, body, policy={"requeue_on_failure": False})
    assert task is not None and task.status == "given-up"
    assert "malformed output: stdout line 2 is not JSON" in (task.reason or "")


def test_an_event_nested_too_deep_is_malformed_output() -> None:
    stream = AgentStream(('{"type": "assistant", "message": ' + "[" * 100_000,), "", 0)
    with pytest.raises(AgentOutputError, match="stdout line 1"):
        parse_stream(stream)


def test_a_result_cut_at_a_bound_is_no_result() -> None:
    stream = AgentStream(('{"type": "system", "subtype": "init"}', '{"type": "result", "res'),
                         "", 0, True, cut_lines=(2,))
    with pytest.raises(AgentOutputError, match="cut at the stream limits"):
        parse_stream(stream)
