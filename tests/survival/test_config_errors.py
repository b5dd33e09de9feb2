"""Survival settings that are wrong are refused naming where, what, and what is allowed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pulse_core import Engine, PulseError
from pulse_survival import Essential, SurvivalConfigError, load_config

PROCESS_FIELDS = "name, argv, pidfile, match_name, match_cmdline, match_env, cwd, env, log"


def refused(settings: Any) -> str:
    with pytest.raises(SurvivalConfigError) as caught:
        load_config(settings)
    return str(caught.value)


@pytest.mark.parametrize(("settings", "message"), [
    ({"processes": [{"name": "bot", "pidfile": "/run/bot.pid", "essential": True}]},
     f"survival.processes[0]: unknown field 'essential' — allowed: {PROCESS_FIELDS}"),
    ({"llm": {"restart": {"name": "proxy", "match_name": "litellm", "args": []}}},
     f"survival.llm.restart: unknown field 'args' (did you mean 'argv'?) — allowed: "
     f"{PROCESS_FIELDS}"),
    ({"rollback": {"auto_errorz": 7}},
     "survival.rollback: unknown field 'auto_errorz' (did you mean 'auto_errors'?) — allowed: "
     "panic_failures, auto_errors, auto_window_s"),
    ({"panic_rollback": False},
     "survival: unknown field 'panic_rollback' (did you mean 'rollback'?) — allowed: "
     "resource_interval_s, disk_paths, processes, process, resource, llm, network, error_log, "
     "rollback, notify"),
])
def test_an_unknown_field_names_where_it_is_and_every_field_allowed_there(
        settings: Any, message: str) -> None:
    assert refused(settings) == message


def test_an_unknown_field_in_a_second_process_names_that_entry() -> None:
    first = {"name": "a", "pidfile": "/run/a.pid"}
    message = refused({"processes": [first, {**first, "name": "b", "restart": "always"}]})
    assert message.startswith("survival.processes[1]: unknown field 'restart'")


def test_a_value_of_the_wrong_type_names_the_field_and_what_was_expected() -> None:
    assert refused({"process": {"startsecs": "soon"}}) == (
        "survival.process.startsecs: expected `float`, got `str` — fix the value")
    assert refused({"processes": [{"name": "bot", "pidfile": 3}]}) == (
        "survival.processes[0].pidfile: expected `str | null`, got `int` — fix the value")
    assert refused({"processes": [{"pidfile": "/run/bot.pid"}]}) == (
        "survival.processes[0]: object missing required field `name` — add it")


def test_a_process_with_no_way_to_find_it_is_refused_saying_what_to_give() -> None:
    assert refused({"processes": [{"name": "bot", "argv": ["bot"]}]}) == (
        "survival: essential process 'bot' has no way to find the process — give pidfile, "
        "match_name or match_cmdline")


def test_a_config_file_and_the_engine_give_the_same_message(tmp_path: Path) -> None:
    bad = {"processes": [{"name": "bot", "pidfile": "/run/bot.pid", "essential": True}]}
    path = tmp_path / "survival.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(SurvivalConfigError) as from_file:
        load_config(path=path)
    with pytest.raises(PulseError) as from_engine:
        Engine(tmp_path / "home", survival=bad)
    assert str(from_file.value) == refused(bad)
    assert refused(bad) in str(from_engine.value)


def test_every_field_of_a_processes_entry_is_documented_and_the_example_loads() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "survival.md").read_text()
    section = page.split("## Watching your own process", 1)[1].split("\n## ", 1)[0]
    for field in msgspec.structs.fields(Essential):
        assert f"\n| `{field.encode_name}` |" in section, field.encode_name
    example = section.split("```json\n", 1)[1].split("```", 1)[0]
    config = load_config(json.loads(example)["survival"])
    assert [p.name for p in config.processes] == ["bot"]


def test_a_blank_route_key_is_refused_naming_the_default() -> None:
    assert "survival.llm.route_key must name the vitals key" in refused({"llm": {"route_key": " "}})
    assert "'llm-route'" in refused({"llm": {"route_key": ""}})


def test_a_renamed_field_is_refused_with_its_new_name() -> None:
    assert "unknown field 'vitals_key' (renamed: now 'route_key')" in refused(
        {"llm": {"vitals_key": "llm-route"}})
