"""Signed notify webhooks: a receiver holding the secret verifies each call with the Standard
Webhooks reference library and refuses any other; the secret never reaches a stored byte."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks import Webhook, WebhookVerificationError

from pulse_core import Engine, Event
from pulse_survival import (
    NotifySinks,
    SurvivalConfigError,
    WebhookSecretInvalid,
    new_webhook_secret,
    sign_webhook,
)
from tests.loopback import RecordedRequest

from .conftest import LoopbackDns, LoopbackHttp
from .test_network import outage_engine


def verifying(secret: str) -> Callable[[RecordedRequest], int]:
    """A receiver's check: 204 for a call signed with `secret`, 401 for any other."""
    def judge(request: RecordedRequest) -> int:
        try:
            Webhook(secret).verify(request.body, request.headers)
        except WebhookVerificationError:
            return 401
        return 204
    return judge


async def signed_outage(tmp_path: Path, dns: LoopbackDns, http: LoopbackHttp,
                        hook: LoopbackHttp, open_engine: Callable[..., Any], *, secret: str,
                        ) -> Engine:
    """An engine whose next step announces an outage to `hook`, signed with `secret`."""
    engine = await outage_engine(tmp_path, dns, http, NotifySinks(
        webhook_url=hook.url("/hook"), webhook_timeout_s=2, webhook_secret=secret),
        open_engine)
    await engine.step()
    return engine


async def the_notice(engine: Engine) -> Event:
    (effect,) = [e for e in await engine.events.read(kinds=["effect"])
                 if e.data["effect"]["type"] == "notify"]
    return effect


async def test_a_signed_notice_is_verified_by_a_receiver_holding_the_secret(
    tmp_path: Path, dns_server: LoopbackDns, http_server: LoopbackHttp,
    hook_server: LoopbackHttp, open_engine: Callable[..., Any],
) -> None:
    secret = new_webhook_secret()
    hook_server.judge = verifying(secret)
    engine = await signed_outage(tmp_path, dns_server, http_server, hook_server, open_engine,
                                 secret=secret)

    effect = await the_notice(engine)
    (acked,) = await engine.events.read(kinds=["effect-acked"], key=effect.key)
    assert acked.data["result"] == {"delivered": ["event", "webhook"]}
    (request,) = hook_server.requests
    assert request.headers["webhook-id"] == effect.key  # the same on every retry
    assert request.json()["effect"] == effect.key


async def test_a_notice_signed_with_another_secret_is_refused_and_the_secret_is_stored_nowhere(
    tmp_path: Path, dns_server: LoopbackDns, http_server: LoopbackHttp,
    hook_server: LoopbackHttp, open_engine: Callable[..., Any],
) -> None:
    hook_server.judge = verifying(new_webhook_secret())
    secret = new_webhook_secret()
    engine = await signed_outage(tmp_path, dns_server, http_server, hook_server, open_engine,
                                 secret=secret)

    effect = await the_notice(engine)
    (failed,) = await engine.events.read(kinds=["effect-failed"], key=effect.key)
    assert "WebhookFailed" in failed.data["error"] and "HTTP 401" in failed.data["error"]
    assert not await engine.events.read(kinds=["effect-acked"], key=effect.key)
    await engine.close()
    stored = [p for p in (tmp_path / "home").rglob("*") if p.is_file()]
    assert any(p.name == "events.db" for p in stored)
    key = secret.removeprefix("whsec_").encode()
    assert [p for p in stored if key in p.read_bytes()] == []


async def test_an_unsigned_webhook_carries_no_signature(
    tmp_path: Path, dns_server: LoopbackDns, http_server: LoopbackHttp,
    hook_server: LoopbackHttp, open_engine: Callable[..., Any],
) -> None:
    engine = await outage_engine(tmp_path, dns_server, http_server, NotifySinks(
        webhook_url=hook_server.url("/hook"), webhook_timeout_s=2), open_engine)
    await engine.step()
    (request,) = hook_server.requests
    assert not {"webhook-id", "webhook-signature", "webhook-timestamp"} & set(request.headers)


def test_the_signature_covers_the_id_the_timestamp_and_every_byte_of_the_body() -> None:
    secret = new_webhook_secret()
    body = b'{"topic":"network","text":"outage"}'
    now = int(time.time())
    headers = sign_webhook(secret, "e-1", now, body)
    verifier = Webhook(secret)
    assert verifier.verify(body, headers) == {"topic": "network", "text": "outage"}
    for forged in ({**headers, "webhook-id": "e-2"},
                   {**headers, "webhook-timestamp": str(now - 1)}):
        with pytest.raises(WebhookVerificationError):
            verifier.verify(body, forged)
    with pytest.raises(WebhookVerificationError):
        verifier.verify(body.replace(b"outage", b"all-ok"), headers)


@pytest.mark.parametrize("secret", [
    "not-a-secret-at-all-but-long-enough",          # no whsec_ prefix
    "whsec_***not*base64***",                       # not base64
    "whsec_" + "QUJD" * 4,                          # 12 bytes: too short
    "whsec_" + "QUJD" * 30,                         # 90 bytes: too long
])
def test_a_malformed_secret_is_refused_without_repeating_it(secret: str) -> None:
    with pytest.raises(SurvivalConfigError, match=r"survival\.notify\.webhook_secret") as raised:
        NotifySinks(webhook_url="https://hooks.example/in", webhook_secret=secret)
    assert secret not in str(raised.value)
    assert "new_webhook_secret" in str(raised.value)


def test_a_secret_without_a_webhook_is_refused() -> None:
    with pytest.raises(SurvivalConfigError, match="webhook_url is not"):
        NotifySinks(webhook_secret=new_webhook_secret())


@given(st.binary(min_size=24, max_size=64))
def test_any_key_of_the_allowed_size_round_trips_and_never_shows_in_a_repr(key: bytes) -> None:
    secret = "whsec_" + base64.b64encode(key).decode()
    sinks = NotifySinks(webhook_url="https://hooks.example/in?token=t0k3n",
                        webhook_secret=secret)
    assert secret not in repr(sinks) and "t0k3n" not in repr(sinks)
    headers = sign_webhook(secret, "e-1", 1, b"{}")
    assert headers["webhook-signature"].startswith("v1,")


def test_sign_webhook_refuses_a_malformed_secret() -> None:
    with pytest.raises(WebhookSecretInvalid):
        sign_webhook("whsec_", "e-1", 1, b"{}")
