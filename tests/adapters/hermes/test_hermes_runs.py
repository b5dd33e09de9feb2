"""The hermes layer in a running engine (SQLite in tmp_path) running the real `hermes` against a
ChatServer on 127.0.0.1: a task created with the real `upulse` CLI is run once and closed with
its result and transcript; a failing model gives the task up with the reason; a missing
program is one clear error while the engine runs on."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pulse_adapters.hermes._transcripts import read_store
from pulse_adapters.llm.stand_in import ChatServer, Stream
from pulse_core import Engine, LayerContext, SystemClock, TaskBoard, TaskState, load_layer
from pulse_core.store import reveal
from tests.adapters.hermes.rig import HermesRig, chat_requests, eventually, hermes_rig, upulse

TEST_TIME_LIMIT_S = 300  # bounds a hang only: hermes starts slowly on a loaded machine


def layer_settings(rig: HermesRig, **extra: Any) -> dict[str, Any]:
    """Settings of a layer running `rig`'s Hermes on one agent, the model given per run."""
    return {"program": str(rig.argv0), "home": str(rig.hermes_home),
            "agents": [{"name": "hermes-1"}], "toolsets": "todo", "ingest_interval_s": 0.2,
            "model": {"provider": "custom", "base_url": rig.server.base_url,
                      "model": "stand-in", "api_key_env": "PULSE_TEST_HERMES_KEY"},
            **extra}


@contextlib.asynccontextmanager
async def running(home: Path, settings: dict[str, Any]) -> AsyncIterator[Engine]:
    """An engine running the installed `hermes` layer (found by its entry point)."""
    layer = load_layer("hermes", settings, LayerContext(home, SystemClock()))
    async with Engine(home, layers=[layer], default_tick_ms=300,
                      executor_scan_interval=0.2) as engine:
        yield engine


async def settled(engine: Engine, task_id: str, timeout_s: float = 180.0) -> TaskState:
    """The task once it is closed or given up."""
    board = TaskBoard(engine.events)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        task = await board.state(task_id)
        if task is not None and task.status in ("closed", "given-up"):
            return task
        await asyncio.sleep(0.1)
    pytest.fail(f"task {task_id} did not settle within {timeout_s} s: {task}")


async def ingested(engine: Engine, hermes_home: Path) -> None:
    """Wait until transcript ingest's cursor is past every message Hermes stored."""
    async def past() -> bool:
        stored, _ = await asyncio.to_thread(read_store, hermes_home / "state.db", 0, 1)
        cursor = await engine.events.read(kinds=["hermes-transcript-cursor"],
                                          newest_first=True, limit=1)
        return bool(stored and cursor and cursor[0].data["message_id"] >= stored)

    await eventually(past, limit_s=120)


@pytest.fixture
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME (and the key variable the layer's model names) private to the test."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PULSE_TEST_HERMES_KEY", "x")
    monkeypatch.delenv("HERMES_HOME", raising=False)
    return home


async def test_a_task_created_with_the_cli_runs_once_and_closes_with_result_and_transcript(
        tmp_path: Path, chat_server: ChatServer, private_home: Path) -> None:
    rig = hermes_rig(tmp_path, chat_server, model=False)
    pulse = tmp_path / "pulse"
    upulse(pulse, "init")
    upulse(pulse, "task", "create", "t-1", "--title", "Greet", "--prompt", "say hi")
    chat_server.script(Stream(("done: ", "hi")))
    started = time.perf_counter()
    async with running(pulse, layer_settings(rig)) as engine:
        task = await settled(engine, "t-1")
        wall = time.perf_counter() - started
        assert task.status == "closed", task.reason
        assert task.agent == "hermes-1"
        assert task.result["result"]["response"] == "done: hi"
        assert task.result["result"]["usage"]["completed"] is True
        assert await engine.objects.get(task.result["transcript"]) == b"done: hi\n"
        runs = [e for e in await engine.events.read(kinds=["effect"])
                if e.data["effect"]["type"] == "hermes-run"]
        assert len(runs) == 1
        kinds = [e.kind for e in await engine.events.read(key="t-1")]
        assert kinds == ["task-created", "task-assigned", "task-executing", "task-acked",
                         "task-closed"]
        # Hermes stored the session; transcript ingest remembers each message once
        await ingested(engine, rig.hermes_home)
        said = [(e.data["role"], reveal(e.data["text"], engine.events.keys))
                for e in await engine.events.read(key="identity:owner")]
        assert said == [("human", "say hi"), ("agent", "done: hi")]
    prompt = [m for m in chat_requests(chat_server)[0]["messages"] if m["role"] == "user"]
    assert prompt[-1]["content"] == "say hi"
    print(f"task created -> closed through hermes: {wall:.1f} s")


async def test_a_failing_model_gives_the_task_up_with_the_reason(
        tmp_path: Path, chat_server: ChatServer, private_home: Path) -> None:
    rig = hermes_rig(tmp_path, chat_server, model=False)  # nothing scripted: HTTP 500
    pulse = tmp_path / "pulse"
    upulse(pulse, "init")
    upulse(pulse, "task", "create", "t-2", "--title", "Greet", "--prompt", "say hi")
    async with running(pulse, layer_settings(rig, policy={"max_requeues": 0})) as engine:
        task = await settled(engine, "t-2")
    assert task.status == "given-up"
    assert task.reason is not None
    assert "hermes-1: the agent reported an error: Hermes reports the run failed" in task.reason
    assert "HTTP 500" in task.reason
    assert "max_requeues=0" in task.reason


async def test_a_missing_program_is_one_error_naming_the_field_and_the_engine_runs_on(
        tmp_path: Path, chat_server: ChatServer, private_home: Path) -> None:
    rig = hermes_rig(tmp_path, chat_server, model=False)
    pulse = tmp_path / "pulse"
    upulse(pulse, "init")
    upulse(pulse, "task", "create", "t-3", "--title", "Greet", "--prompt", "say hi")
    settings = layer_settings(rig, program=str(tmp_path / "no" / "hermes"))
    async with running(pulse, settings) as engine:
        async def recorded() -> bool:
            return bool(await engine.events.read(kinds=["error"],
                                                 key="service:hermes-program"))

        await eventually(recorded)
        ticks = engine.ticks

        async def ticking() -> bool:
            return engine.ticks > ticks + 2

        await eventually(ticking)
        errors = await engine.events.read(kinds=["error"], key="service:hermes-program")
        task = await TaskBoard(engine.events).state("t-3")
    assert len(errors) == 1
    message = errors[0].data["message"]
    assert message.startswith("layers.hermes.program: ")
    assert "does not exist" in message and "set layers.hermes.program" in message
    assert task is not None and task.status == "pending"  # nothing was dispatched
