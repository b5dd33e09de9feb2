"""A host's program: found, new enough, or an error naming the field, what was found and
what to do; checked once at engine start by a service, the engine running on."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from pulse_adapters.agents import (
    AgentSpec,
    Program,
    ProgramCheck,
    ProgramUnavailable,
    TaskDispatcher,
    check_program,
)
from pulse_core import Engine, Layer
from tests.adapters.agents.rig import ScriptExecutor, ScriptRun

FIELD = "layers.hermes.program"


def _fake(tmp_path: Path, output: str, code: int = 0) -> Path:
    program = tmp_path / "hermes"
    program.write_text(f"#!/bin/sh\necho '{output}'\nexit {code}\n")
    program.chmod(0o755)
    return program


def test_a_program_missing_from_path_names_the_field_and_the_fix() -> None:
    status = check_program(Program(field=FIELD, argv0="no-such-hermes-xyz",
                                   install_hint="pip install hermes-agent==0.19.0"))
    assert not status.ok and status.path is None
    assert status.problem == (
        f"{FIELD}: `no-such-hermes-xyz` was not found on PATH — pip install "
        f"hermes-agent==0.19.0, or set {FIELD} to its path")


def test_a_path_that_does_not_exist_is_named(tmp_path: Path) -> None:
    status = check_program(Program(field=FIELD, argv0=str(tmp_path / "nope")))
    assert status.problem is not None and f"{tmp_path / 'nope'} does not exist" in status.problem


def test_an_old_version_is_refused_with_the_version_found(tmp_path: Path) -> None:
    program = _fake(tmp_path, "Hermes Agent v0.18.0 (2026.1.1)")
    status = check_program(Program(field=FIELD, argv0=str(program), min_version="0.19.0"))
    assert status.version == "0.18.0"
    assert status.problem == (f"{FIELD}: hermes 0.18.0 is older than 0.19.0 — upgrade it, or "
                              f"set {FIELD} to a newer one")


def test_a_new_enough_program_is_found_by_name_on_the_given_path(tmp_path: Path) -> None:
    _fake(tmp_path, "hermes 0.19.2")
    status = check_program(Program(field=FIELD, argv0="hermes", min_version="0.19.0",
                                   env={"PATH": str(tmp_path)}))
    assert status.ok and status.version == "0.19.2" and status.path == str(tmp_path / "hermes")


def test_a_version_probe_that_fails_is_a_problem(tmp_path: Path) -> None:
    status = check_program(Program(field=FIELD, argv0=str(_fake(tmp_path, "boom", code=2))))
    assert status.problem is not None and "exited with 2 (boom)" in status.problem


async def test_the_check_service_records_the_problem_once_and_the_engine_runs_on(
        tmp_path: Path) -> None:
    check = ProgramCheck(Program(field="layers.script.program", argv0="no-such-agent-xyz"),
                         name="script-program")
    executor = ScriptExecutor(tmp_path / "pids", check=check)
    layer = Layer("script", rules=(TaskDispatcher(ScriptRun, [AgentSpec(name="a")],
                                                  program=check),),
                  executors=(executor,), services=(check,))
    engine = Engine(tmp_path / "home", layers=[layer], default_tick_ms=50)
    async with engine:
        for _ in range(200):
            errors = await engine.events.read(kinds=["error"], key="service:script-program")
            if errors and engine.ticks >= 3:
                break
            await asyncio.sleep(0.02)
        assert [e.data["type"] for e in errors] == ["ProgramUnavailable"]
        assert "`no-such-agent-xyz` was not found on PATH" in errors[0].data["message"]
        assert engine.ticks >= 3  # the engine ticks on
        try:
            await check.require()
        except ProgramUnavailable as exc:
            assert str(exc) == check.problem
        else:
            raise AssertionError("require() accepted a missing program")


async def test_the_interpreter_as_program_passes(tmp_path: Path) -> None:
    check = ProgramCheck(Program(field="x.program", argv0=sys.executable, min_version="3.11"),
                         name="py")
    assert await check.require() == sys.executable
