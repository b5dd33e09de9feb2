"""What a notice may tell the agent: a webhook's path, query or user info (where its token
lives) never reaches an agent's session, through a notify's text or an effect's fields."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from pulse_adapters.agents import notice_fields
from pulse_adapters.hermes._notices import notice_line
from pulse_adapters.openclaw import notice_text
from pulse_core import Engine
from pulse_core._effects import effect_draft
from pulse_survival import NotifySinks, SurvivalConfig
from pulse_survival.effects import Notify
from tests.loopback import LOOPBACK, LoopbackServer

TEST_TIME_LIMIT_S = 30

SECRETS = ("hook-user", "pa55word", "/hooks", "T0", "KEN", "S3CRET")


class Failing(BaseHTTPRequestHandler):
    """A webhook receiver that fails every POST."""

    def do_POST(self) -> None:
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def failing_webhook() -> Iterator[int]:
    """A loopback HTTP server answering 500 to every POST; yields its port."""
    server = LoopbackServer()
    server.serve(Failing)
    try:
        yield server.port
    finally:
        server.shutdown()


@pytest.mark.parametrize("path", ["/hooks/T0KEN?key=S3CRET", "/hooks/{T0KEN}?key=S3CRET",
                                  "/hooks/T0|KEN^S3CRET"])
async def test_a_failed_webhook_s_path_and_secret_never_reach_the_agent_s_notice(
        tmp_path: Path, failing_webhook: int, path: str) -> None:
    url = f"http://hook-user:pa55word@{LOOPBACK}:{failing_webhook}{path}"
    engine = Engine(tmp_path / "home", survival=SurvivalConfig(
        notify=NotifySinks(webhook_url=url, webhook_timeout_s=2)))
    await engine.open()
    try:
        # a notice that quotes the hook it reports on, as an operator's rule writes one
        await engine.events.append([effect_draft(Notify(
            topic="deploy", level="warning", text=f"the deploy hook {url} is failing"),
            "survival")])
        await engine.executor_loop.run_until_idle()
        [failed] = await engine.events.read(kinds=["effect-failed"])
        [effect] = await engine.events.read(kinds=["effect"])
    finally:
        await engine.close()
    error = failed.data["error"]
    assert f"notify webhook http://{LOOPBACK}:{failing_webhook} answered HTTP 500" in error
    body = effect.data["effect"]
    reporting = {"type": "deploy-check", "error": error, "hook": url, "nested": {"at": url}}
    notices = {
        "openclaw, the notify": notice_text(body),
        "hermes, the notify": notice_line(body),
        "openclaw, an effect's fields": notice_text(reporting),
        "hermes, an effect's fields": notice_line(reporting),
    }
    assert f"the deploy hook http://{LOOPBACK}:{failing_webhook} is failing" in \
        notices["openclaw, the notify"]
    assert f"http://{LOOPBACK}:{failing_webhook}" in notices["hermes, an effect's fields"]
    for secret in SECRETS:
        assert secret not in error, secret
        for where, notice in notices.items():
            assert secret not in notice, (where, secret, notice)


async def test_a_webhook_url_with_characters_a_url_must_encode_is_named_by_its_origin_only(
        tmp_path: Path, failing_webhook: int) -> None:
    url = f'http://hook user:pa55word@{LOOPBACK}:{failing_webhook}/hooks/T0"KEN<S3CRET>'
    engine = Engine(tmp_path / "home", survival=SurvivalConfig(
        notify=NotifySinks(webhook_url=url, webhook_timeout_s=2)))
    await engine.open()
    try:
        await engine.events.append([effect_draft(Notify(topic="t", level="info", text="hi"),
                                                 "survival")])
        await engine.executor_loop.run_until_idle()
        [failed] = await engine.events.read(kinds=["effect-failed"])
    finally:
        await engine.close()
    error = failed.data["error"]
    assert f"notify webhook http://{LOOPBACK}:{failing_webhook} answered HTTP 500" in error
    for secret in SECRETS:
        assert secret not in error, secret


def test_notice_fields_never_show_the_type_or_a_restart_s_env() -> None:
    effect = {"type": "restart-process", "name": "gateway", "env": {"API_KEY": "sk-0123"}}
    assert notice_fields(effect) == {"name": "gateway"}
