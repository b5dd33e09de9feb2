"""The openclaw layer without a gateway: settings refused by field, transcript rows read or
refused, notice text, the gateway as an essential, a missing program recorded at start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pulse_adapters.openclaw import (
    GATEWAY,
    TranscriptRow,
    build_openclaw,
    layer,
    message_of,
    notice_text,
)
from pulse_adapters.openclaw._ingest import Malformed
from pulse_core import Engine, LayerContext, LayerError, ManualClock, available_layers, load_layer
from tests.adapters.openclaw.rig import eventually


@pytest.mark.parametrize(("settings", "field", "problem"), [
    ({"progam": "openclaw"}, "progam", "did you mean `program`"),
    ({"gateway": {"port": 0}}, "layers.openclaw.gateway.port", "TCP port"),
    ({"gateway": {"interval_s": 0}}, "layers.openclaw.gateway.interval_s", "> 0"),
    ({"model": {"base_url": "127.0.0.1:8080"}}, "layers.openclaw.model.base_url", "http://"),
    ({"model": {"api_key_env": "sk-123"}}, "layers.openclaw.model.api_key_env", "NAME"),
    ({"notices": {"retry_initial_s": 9, "retry_max_s": 1}},
     "layers.openclaw.notices.retry_max_s", ">= retry_initial_s"),
    ({"transcripts": {"identity": " "}}, "layers.openclaw.transcripts.identity", "identity"),
    ({"agent": "Main Agent"}, "layers.openclaw.agent", "agent id"),
    ({"notices": {"effects": "notify"}}, "notices.effects", "Expected `array`"),
    (["openclaw"], "layers.openclaw", "JSON object"),
])
def test_bad_settings_are_refused_naming_the_field(
    tmp_path: Path, settings: Any, field: str, problem: str,
) -> None:
    context = LayerContext(tmp_path, ManualClock())
    for build in (layer, lambda s, c: load_layer("openclaw", s, c)):
        with pytest.raises(LayerError) as refused:
            build(settings, context)
        assert field in str(refused.value) and problem in str(refused.value), refused.value


def test_the_layer_is_installed_and_declares_its_gateway_essential(tmp_path: Path) -> None:
    assert "openclaw" in available_layers()
    built = layer({"program": "/opt/oc/openclaw", "env": {"HOME": "/srv/oc"},
                   "gateway": {"port": 18800, "args": ["--auth", "none"]}},
                  LayerContext(tmp_path, ManualClock()))
    (essential,) = built.essentials
    assert essential.name == GATEWAY == "openclaw-gateway"
    assert essential.argv == ("/opt/oc/openclaw", "gateway", "run", "--port", "18800",
                              "--auth", "none")
    assert essential.pidfile == str(tmp_path / "run" / "openclaw-gateway.pid")
    assert essential.env == {"HOME": "/srv/oc"}
    assert [w.name for w in built.watchers] == ["openclaw-gateway", "openclaw-sessions",
                                                "openclaw-model-route"]
    assert [w.key for w in built.watchers][-1] == "llm-route"
    assert not layer({"gateway": {"keep_alive": False}},
                     LayerContext(tmp_path, ManualClock())).essentials


def row(entry: Any, seq: int = 1) -> TranscriptRow:
    return TranscriptRow("s-1", seq, entry if isinstance(entry, str) else json.dumps(entry))


def test_messages_are_read_and_everything_else_passed_over() -> None:
    user = {"type": "message", "id": "m1", "message": {"role": "user", "content": " hi "}}
    said = {"type": "message", "id": "m2", "message": {
        "role": "assistant", "content": [{"type": "text", "text": "hello"},
                                         {"type": "toolCall", "name": "ls"}]}}
    assert message_of(row(user)) == ("m1", "human", "hi")
    assert message_of(row(said)) == ("m2", "agent", "hello")
    for passed in (
        {"type": "session", "id": "s-1"},
        {"type": "message", "id": "m3", "message": {"role": "toolResult", "content": "ok"}},
        {"type": "message", "id": "m4", "message": {
            "role": "user", "content": "[OpenClaw heartbeat poll]",
            "provenance": {"kind": "internal_system"}}},
        {"type": "message", "id": "m5", "message": {
            "role": "assistant", "content": [{"type": "text", "text": "[pulse:e-1]\n\ndisk"}]}},
    ):
        assert message_of(row(passed)) is None


@pytest.mark.parametrize(("text", "reason"), [
    ("{broken", "not JSON"), ('"a string"', "str"), (None, "compressed"),
    ('{"type": "message", "message": {"role": "user"}}', "without an id"),
])
def test_unreadable_rows_say_why(text: str | None, reason: str) -> None:
    with pytest.raises(Malformed, match=reason):
        message_of(TranscriptRow("s-1", 3, text))


def test_notice_text_names_level_topic_and_text() -> None:
    assert notice_text({"type": "notify", "topic": "disk", "level": "warning",
                        "text": "disk / is 91% full"}) == \
        "[pulse] warning (disk): disk / is 91% full"
    assert notice_text({"type": "restart-process", "name": "bot"}) == \
        '[pulse] restart-process: {"name":"bot"}'


async def test_a_missing_program_is_recorded_once_and_the_engine_runs_on(
    tmp_path: Path,
) -> None:
    parts = build_openclaw({"program": str(tmp_path / "no-openclaw"),
                            "gateway": {"keep_alive": False}, "model": {"probe": False},
                            "state_dir": str(tmp_path / "state")},
                           LayerContext(tmp_path / "home", ManualClock()))
    async with Engine(tmp_path / "home", layers=[parts.layer]) as engine:
        async def recorded() -> bool:
            return bool(await engine.events.read(key="service:openclaw-program"))

        await eventually(recorded, limit_s=30)
        (error,) = await engine.events.read(key="service:openclaw-program")
        assert await parts.transcripts.ingest(engine.events) == 0  # no store yet: nothing
    assert "layers.openclaw.program" in error.data["message"]
    assert "does not exist" in error.data["message"]
