"""config.json: one file, checked on load; every error names the field and what is allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pulse_cli.assembly import configured_layers
from pulse_cli.config import MAX_DEPTH, ConfigError, default_config_text, load, parse_config
from pulse_cli.home import UsageError, resolve_home
from pulse_core import ManualClock
from pulse_survival import SurvivalConfig
from tests.cli.runner import Upulse


def refused(document: object) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(json.dumps(document).encode())
    return str(caught.value)


def test_the_config_init_writes_loads_with_every_default() -> None:
    config = parse_config(default_config_text("night-shift").encode())
    assert config.instance == "night-shift"
    assert config.default_tick_ms == 5_000
    assert config.daemon.drain_timeout_s == 10.0
    assert config.survival == SurvivalConfig()
    assert config.store is None and dict(config.layers) == {}


def test_a_value_of_the_wrong_type_names_the_field_the_allowed_values_and_what_was_found(
) -> None:
    message = refused({"daemon": {"drain_timeout_s": "soon"}})
    assert message == ('config.json: daemon.drain_timeout_s must be a number > 0 and <= 3600, '
                       'got "soon"')


def test_a_number_out_of_range_is_refused_with_the_range() -> None:
    message = refused({"default_tick_ms": 5})
    assert message == "config.json: default_tick_ms must be an integer from 100 to 600000, got 5"
    assert "daemon.drain_timeout_s must be a number > 0" in refused(
        {"daemon": {"drain_timeout_s": -1}})


def test_an_unknown_field_is_refused_with_the_fields_allowed_there() -> None:
    assert refused({"daemon": {"drain": 3}}) == (
        "config.json: daemon: unknown field 'drain' — allowed: drain_timeout_s, log_max_bytes, "
        "log_format")
    assert refused({"tick": 3}) == (
        "config.json: unknown field 'tick' — allowed: instance, default_tick_ms, daemon, "
        "survival, store, side_store, host, layers, mcp")
    assert refused({"daemon": {"log_max_byte": 3}}).startswith(
        "config.json: daemon: unknown field 'log_max_byte' (did you mean 'log_max_bytes'?)")


def test_an_unknown_survival_field_names_the_entry_and_the_fields_allowed_there() -> None:
    watched = {"name": "bot", "pidfile": "/run/bot.pid", "essential": True}
    assert refused({"survival": {"processes": [watched]}}) == (
        "config.json: survival.processes[0]: unknown field 'essential' — allowed: name, argv, "
        "pidfile, match_name, match_cmdline, match_env, cwd, env, log")
    assert refused({"survival": {"process": {"startsecs": "soon"}}}) == (
        "config.json: survival.process.startsecs: expected `float`, got `str` — fix the value")


def test_an_unknown_layer_setting_names_the_layer_and_the_fields_allowed_there(
        tmp_path: Path) -> None:
    review = {"intervl_s": 120}
    cfg = parse_config(json.dumps({"layers": {"awareness": {
        "base_url": "http://127.0.0.1:8080/v1", "model": "m", "review": review}}}).encode())
    with pytest.raises(ConfigError) as caught:
        configured_layers(tmp_path, cfg, clock=ManualClock())
    message = str(caught.value)
    assert "layers: layer 'awareness'" in message
    assert ("setting `review`: unknown field `intervl_s` (did you mean `interval_s`?) — "
            "allowed: interval_s, fallback_interval_s, initial_delay_s,") in message
    assert message.endswith(", calls_per_day, max_tokens, shared_route, foreground_wait_s,"
                            " foreground_lapse_s")


def test_survival_settings_are_checked_against_the_survival_layers_hard_bounds() -> None:
    message = refused({"survival": {"resource": {"memory_pct": 20}}})
    assert "survival.resource.memory_pct = 20" in message
    assert "[50, 99]" in message
    assert "survival.resource" in refused({"survival": {"resource": {"memory": 95}}})


def test_layers_keep_their_order_and_a_store_url_is_kept_as_given() -> None:
    config = parse_config(json.dumps({
        "store": "sqlite:///var/pulse/events.db?synchronous=NORMAL",
        "layers": {"zeta": {"level": 1}, "alpha": None, "mid": {}},
    }).encode())
    assert list(config.layers) == ["zeta", "alpha", "mid"]
    assert config.layers["zeta"] == {"level": 1} and config.layers["alpha"] is None
    assert config.store == "sqlite:///var/pulse/events.db?synchronous=NORMAL"


def test_layers_of_the_wrong_shape_are_refused_naming_the_layer() -> None:
    assert refused({"layers": ["awareness"]}) == (
        "config.json: layers must be an object mapping each layer's name to its settings, in "
        'order, got ["awareness"]')
    assert refused({"layers": {"awareness": {}, "web": "on"}}) == (
        "config.json: layers.web must be an object of that layer's settings, or null, "
        'got "on"')
    assert "survival layer always runs" in refused({"layers": {"survival": {}}})
    assert refused({"layers": {" ": {}}}) == 'config.json: layers: " " is not a layer name'


def test_a_store_url_pulse_cannot_open_is_refused_naming_the_field() -> None:
    assert refused({"store": "ftp://db/pulse"}).startswith(
        "config.json: store: store URL 'ftp://db/pulse': ")
    assert refused({"store": "sqlite://events.db"}).startswith(
        "config.json: store: store URL 'sqlite://events.db': ")
    assert refused({"store": 5}).startswith("config.json: store must be a store URL")


def test_a_bad_instance_name_and_broken_json_are_refused() -> None:
    assert "instance must be an instance name" in refused({"instance": "../etc"})
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_config(b"{ nope")


def not_json(text: bytes) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    return str(caught.value)


def test_text_that_is_not_json_is_refused_at_its_line_and_column() -> None:
    assert not_json(b'{\n  "daemon": {\n    "drain_timeout_s": 3,\n  }\n}\n') == (
        "config.json: not valid JSON at line 4, column 3: trailing comma in object — fix it "
        "there")
    assert not_json('{"instance": "é",\n "x": 1} y'.encode()).startswith(
        "config.json: not valid JSON at line 2, column 10: trailing characters")
    assert not_json(b'{"daemon": {') == (
        "config.json: not valid JSON at line 1, column 13: input data was truncated — fix it "
        "there")


def test_a_config_nested_too_deeply_is_refused_naming_where() -> None:
    deep: object = 1
    for _ in range(MAX_DEPTH):
        deep = {"x": deep}
    assert refused({"layers": {"web": deep}}).startswith(
        "config.json: layers.web.x.x.")
    assert refused({"layers": {"web": deep}}).endswith(
        f"nests objects or arrays more than {MAX_DEPTH} levels deep — no setting needs that; "
        "flatten it")
    assert not_json(b"[" * 100_000) == (
        f"config.json: nests objects or arrays more than {MAX_DEPTH} levels deep — no setting "
        "needs that; flatten it")
    shallow = parse_config(json.dumps({"layers": {"web": {"a": {"b": [1, [2]]}}}}).encode())
    assert shallow.layers["web"] == {"a": {"b": [1, [2]]}}


def test_a_missing_config_says_to_run_init(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="upulse init"):
        load(tmp_path / "config.json")


def test_instance_names_a_home_under_the_base_and_home_wins_when_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPULSE_HOME", str(tmp_path / "base"))
    assert resolve_home(None, None) == tmp_path / "base"
    assert resolve_home(None, "blue") == tmp_path / "base" / "instances" / "blue"
    assert resolve_home(tmp_path / "x", None) == tmp_path / "x"
    with pytest.raises(UsageError, match="instance name"):
        resolve_home(None, "../escape")


def test_a_daemon_with_a_bad_config_does_not_start_and_says_which_field(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    config = json.loads((home / "config.json").read_text())
    config["daemon"]["drain_timeout_s"] = "soon"
    (home / "config.json").write_text(json.dumps(config))
    done = upulse("daemon", "start", "--home", home, ok=False)
    assert done.returncode == 1
    assert 'daemon.drain_timeout_s must be a number > 0 and <= 3600, got "soon"' in done.stderr
    assert not (home / "daemon.pid").exists()


def test_a_bad_instance_name_on_the_command_line_is_a_usage_error(upulse: Upulse) -> None:
    done = upulse("init", "--instance", "no/slashes", ok=False)
    assert done.returncode == 2
    assert "instance name 'no/slashes'" in done.stderr
