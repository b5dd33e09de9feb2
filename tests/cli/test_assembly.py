"""One place assembles an engine from a home: config.json's layers (found through their entry
points) and the engine directory's LAYER; the daemon, `upulse tick`, `upulse dev` and the
promote gate all build theirs with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pulse_cli.assembly import NO_CODE, BrokenLayer, build_engine, configured_layers, load_code
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
    edit(staging / "engine.py", 'executors=[NoteExecutor(HOME / "notes.md")],',
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
