"""One place assembles an engine from a home: config.json's layers (found through their entry
points) and the engine directory's LAYER; the daemon, `upulse tick`, `upulse dev` and the
promote gate all build theirs with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pulse_cli.assembly import (
    NO_CODE,
    BrokenLayer,
    build_engine,
    configured_layers,
    load_code,
    tick_source,
)
from pulse_cli.config import parse_config
from pulse_cli.enginedir import init_engine_dir
from pulse_core import SystemClock, UnhandledEffect
from tests.cli.support import RULE, edit, install_probe_layer


@pytest.fixture
def probe_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `probe` layer, installed as a third-party distribution would be."""
    monkeypatch.syspath_prepend(str(install_probe_layer(tmp_path / "site")))



def test_the_chain_is_survival_builtins_configured_layers_in_order_then_the_engine_directory(
        tmp_path: Path, probe_installed: None) -> None:
    assert init_engine_dir(tmp_path / "home")
    cfg = parse_config(json.dumps({"layers": {"probe": {"tag": "x"}}}).encode())
    engine = build_engine(tmp_path / "home", cfg, load_code(tmp_path / "home" / "engine"))
    tiers = [tier for tier, _ in engine.chain.tiers]
    assert tiers == sorted(tiers, key=["survival", "builtin", "probe", "engine"].index)
    assert [name for tier, name in engine.chain.tiers if tier in ("probe", "engine")] == [
        "probe_passes", "inbox_note"]
    assert {w.name for w in engine.watchers} >= {"probe", "inbox"}
    assert "NoteExecutor" in {e.name for e in engine.executors}


def test_a_home_without_an_engine_directory_runs_an_empty_business_layer(
        tmp_path: Path) -> None:
    assert load_code(tmp_path / "no-engine") is NO_CODE
    engine = build_engine(tmp_path, parse_config(b"{}"), NO_CODE)
    assert [tier for tier, _ in engine.chain.tiers if tier == "engine"] == []


def test_a_rule_that_declares_an_effect_no_executor_handles_is_refused_at_build(
        tmp_path: Path) -> None:
    assert init_engine_dir(tmp_path / "home")
    staging = tmp_path / "home" / "staging"
    edit(staging / "engine.py", 'executors=[NoteExecutor(context.home / paths.notes)],',
         "executors=[],")
    with pytest.raises(UnhandledEffect, match=r"inbox_note \(layer 'engine'\) emits 'note'"):
        build_engine(tmp_path / "home", parse_config(b"{}"), load_code(staging, staged=True))
    edit(staging / RULE, "@emits(Note)\n", "")  # undeclared: only the dry run can tell
    build_engine(tmp_path / "home", parse_config(b"{}"), load_code(staging, staged=True))


def test_a_configured_layer_that_is_missing_or_refuses_its_settings_names_field_and_layer(
        tmp_path: Path, probe_installed: None) -> None:
    clock = SystemClock()
    missing = parse_config(json.dumps({"layers": {"no-such": {}}}).encode())
    with pytest.raises(BrokenLayer) as refused:
        configured_layers(tmp_path, missing, clock=clock)
    assert str(refused.value).startswith(
        f"{tmp_path / 'config.json'}: layers: no layer named 'no-such' is installed "
        "(installed: ")
    assert "probe" in str(refused.value)

    wrong = parse_config(json.dumps({"layers": {"probe": {"tag": 5}}}).encode())
    with pytest.raises(BrokenLayer, match=r"layer 'probe' refused its settings: "
                                          r"ValidationError: .* at `\$\.tag`"):
        build_engine(tmp_path, wrong, NO_CODE)
    [probe] = configured_layers(
        tmp_path, parse_config(json.dumps({"layers": {"probe": {"tag": "t"}}}).encode()),
        clock=clock)
    assert probe.name == "probe" and [w.name for w in probe.watchers] == ["probe"]


async def test_engine_code_reads_and_writes_the_home_it_is_built_for_not_where_its_files_lie(
        tmp_path: Path) -> None:
    """Item 12: the template built (as `upulse dev`, `tick` and the gate build it) for a
    scratch home counts that home's inbox and writes that home's notes.md; the home the
    engine directory lives in is not touched."""
    live, scratch = tmp_path / "live", tmp_path / "scratch"
    assert init_engine_dir(live)
    for home, messages in ((live, 5), (scratch, 2)):
        (home / "inbox").mkdir(parents=True)
        for n in range(messages):
            (home / "inbox" / f"m{n}.txt").write_text("hello")
    engine = build_engine(scratch, parse_config(b"{}"), load_code(live / "staging", staged=True))
    await engine.open()
    try:
        await engine.step()
    finally:
        await engine.close()
    assert (scratch / "notes.md").read_text().endswith(" 2 message(s) waiting in the inbox\n")
    assert not (live / "notes.md").exists()


def test_the_engine_directorys_default_tick_wins_over_the_homes_when_it_sets_one(
        tmp_path: Path) -> None:
    """Item 13: engine/config.json's default_tick_ms, when set, is the engine's default
    tick; without it, the home config.json's applies."""
    assert init_engine_dir(tmp_path / "home")
    engine_dir = tmp_path / "home" / "staging"
    home_cfg = parse_config(b'{"default_tick_ms": 700}')
    code = load_code(engine_dir, staged=True)
    assert build_engine(tmp_path / "run", home_cfg, code).default_tick_ms == 700
    assert tick_source(code, tmp_path / "home") == tmp_path / "home" / "config.json"
    (engine_dir / "config.json").write_text('{"default_tick_ms": 300}')
    code = load_code(engine_dir, staged=True)
    engine = build_engine(tmp_path / "run", home_cfg, code)
    assert engine.default_tick_ms == 300 and engine.last_tick_ms == 300
    assert tick_source(code, tmp_path / "home") == engine_dir / "config.json"
