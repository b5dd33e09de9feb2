"""The session primer file in the OpenClaw agent's workspace: written at start and after each
working-state refresh that changes it, owner-only, never half-written; a workspace that
cannot be written is recorded once and written once it can; a path outside the workspace or
one the hook would not load is refused. Fast: no gateway (test_gateway.py shows the model
reading the file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pulse_adapters.maintenance import run_cycle
from pulse_adapters.openclaw import PRIMER_WRITTEN, build_openclaw
from pulse_core import Engine, EventDraft, LayerContext, LayerError, ManualClock, SystemClock
from pulse_core.memory import identity_key
from tests.adapters.openclaw.rig import eventually


def layer(tmp_path: Path, workspace: Path, **primer: Any) -> Any:
    settings = {"gateway": {"keep_alive": False, "port": 1}, "model": {"probe": False},
                "notices": {"enabled": False}, "transcripts": {"enabled": False},
                "state_dir": str(tmp_path / "state"),
                "primer": {"enabled": True, "workspace": str(workspace), **primer}}
    return build_openclaw(settings, LayerContext(tmp_path / "home", SystemClock())).layer


async def commit(engine: Engine, record: str, text: str) -> None:
    clock = SystemClock()
    await engine.events.append([
        EventDraft("identity-registered", identity_key("ana"), {"name": "Ana"}, origin="agent"),
        EventDraft("commitment-made", identity_key("ana"),
                   {"record": record, "text": text, "due_at": clock.now_ms() + 3_600_000},
                   origin="agent")])
    await run_cycle(engine.events, clock=clock)


async def written(engine: Engine, count: int) -> None:
    async def enough() -> bool:
        return len(await engine.events.read(kinds=[PRIMER_WRITTEN])) >= count

    await eventually(enough, limit_s=30)


async def test_the_primer_is_written_at_start_and_after_each_refresh_owner_only(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "workspace"
    path = workspace / "pulse" / "MEMORY.md"
    async with Engine(tmp_path / "home", layers=[layer(tmp_path, workspace)]) as engine:
        await written(engine, 1)
        assert "No maintenance cycle" in path.read_text()
        await commit(engine, "c1", "send Ana the report")
        await written(engine, 2)
        assert "- send Ana the report (due " in path.read_text()
        await run_cycle(engine.events, clock=SystemClock())  # nothing changed: not rewritten
        await commit(engine, "c2", "call the plumber")
        await written(engine, 3)
        records = await engine.events.read(kinds=[PRIMER_WRITTEN])
    text = path.read_text()
    assert "call the plumber" in text and "send Ana the report" in text
    assert len(records) == 3
    assert records[-1].data == {"path": str(path), "chars": len(text)}
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["MEMORY.md"]  # no temp left


async def test_the_primer_is_cut_to_max_chars(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    async with Engine(tmp_path / "home",
                      layers=[layer(tmp_path, workspace, max_chars=120)]) as engine:
        await commit(engine, "c1", "a very long commitment " * 20)
        await written(engine, 2)
    body = (workspace / "pulse" / "MEMORY.md").read_text().split("\n\n", 1)[1]
    assert len(body.rstrip("\n")) <= 120 and body.rstrip().endswith("...")


async def test_a_workspace_that_cannot_be_written_is_recorded_once_then_written(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "pulse").write_text("a file where the primer's folder should be")
    async with Engine(tmp_path / "home", layers=[layer(tmp_path, workspace)]) as engine:
        await commit(engine, "c1", "send Ana the report")
        await commit(engine, "c2", "call the plumber")

        async def refused() -> bool:
            return bool(await engine.events.read(key="service:openclaw-primer"))

        await eventually(refused, limit_s=30)
        (workspace / "pulse").unlink()
        await commit(engine, "c3", "water the plants")
        await written(engine, 1)
        errors = await engine.events.read(key="service:openclaw-primer")
    assert len(errors) == 1 and errors[0].data["type"] in {"FileExistsError",
                                                           "NotADirectoryError"}
    assert errors[0].data["path"] == str(workspace / "pulse" / "MEMORY.md")
    assert "water the plants" in (workspace / "pulse" / "MEMORY.md").read_text()


@pytest.mark.parametrize(("path", "problem"), [
    ("../outside/MEMORY.md", "inside the workspace"),
    ("/etc/MEMORY.md", "inside the workspace"),
    ("pulse/PRIMER.md", "bootstrap-extra-files"),
])
def test_a_primer_path_the_hook_would_not_load_is_refused(
    tmp_path: Path, path: str, problem: str,
) -> None:
    with pytest.raises(LayerError) as refused:
        build_openclaw({"primer": {"enabled": True, "path": path}},
                       LayerContext(tmp_path, ManualClock()))
    assert "layers.openclaw.primer.path" in str(refused.value)
    assert problem in str(refused.value)
