"""The network watcher and network_watchdog against real loopback DNS and HTTP servers, and the
notify executor's sinks (log file, webhook) against a real loopback webhook."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pulse_core import Engine, Event
from pulse_survival import NetworkTargets, NotifySinks, SurvivalConfig
from pulse_survival.watchers import NetworkWatcher, network_outage

from .conftest import LoopbackDns, LoopbackHttp

NAME = "agent.test"
ADDRESS = "10.20.30.40"


def targets(dns: LoopbackDns, http: LoopbackHttp, samples: int = 2) -> NetworkTargets:
    return NetworkTargets(dns_names=(NAME,), dns_servers=("127.0.0.1",), dns_port=dns.port,
                          http_urls=(http.url("/health"),), timeout_s=0.3, interval_s=1,
                          samples=samples)


async def network_notices(engine: Engine) -> list[dict[str, Any]]:
    """The `notify` effects about the network, oldest first."""
    bodies = [e.data["effect"] for e in await engine.events.read(kinds=["effect"])]
    return [b for b in bodies if b["type"] == "notify" and b["topic"] == "network"]


async def notifications(engine: Engine, topic: str) -> list[Event]:
    return [e for e in await engine.events.read(kinds=["notification"]) if e.key == topic]


# -- the watcher -----------------------------------------------------------------------------


async def test_collect_reports_ok_and_latency_per_target_while_both_servers_answer(
    dns_server: LoopbackDns, http_server: LoopbackHttp
) -> None:
    watcher = NetworkWatcher(targets(dns_server, http_server))
    data = await asyncio.wait_for(watcher.collect(), 5)

    url = http_server.url("/health")
    assert data["dns"][NAME]["ok"] is True
    assert data["dns"][NAME]["answers"] == [ADDRESS]
    assert 0 <= data["dns"][NAME]["latency_ms"] < 300
    assert data["http"][url]["ok"] is True
    assert data["http"][url]["status"] == 200
    assert 0 <= data["http"][url]["latency_ms"] < 300
    assert (data["dns_ok"], data["http_ok"]) == (True, True)
    assert not network_outage(data)
    # the queries reached our server on its own port, and the GET our server
    assert dns_server.queries and set(dns_server.queries) == {NAME}
    assert [(r.method, r.path) for r in http_server.requests] == [("GET", "/health")]


async def test_collect_reports_an_error_per_target_while_dns_is_silent_and_http_is_closed(
    dns_server: LoopbackDns, http_server: LoopbackHttp
) -> None:
    watcher = NetworkWatcher(targets(dns_server, http_server))
    url = http_server.url("/health")
    dns_server.answering = False
    http_server.stop()

    data = await asyncio.wait_for(watcher.collect(), 5)

    dns_result, http_result = data["dns"][NAME], data["http"][url]
    assert dns_result["ok"] is False
    assert "timeout" in dns_result["error"].lower() or "timed out" in dns_result["error"]
    assert 250 <= dns_result["latency_ms"] < 2_000  # bounded by timeout_s
    assert http_result["ok"] is False
    assert http_result["error"].startswith("ConnectError")
    assert "status" not in http_result
    assert (data["dns_ok"], data["http_ok"]) == (False, False)
    assert dns_server.queries  # the resolver did ask our server


async def test_collect_reports_an_error_when_the_dns_port_is_closed_and_http_answers_500(
    dns_server: LoopbackDns, http_server: LoopbackHttp
) -> None:
    watcher = NetworkWatcher(targets(dns_server, http_server))
    url = http_server.url("/health")
    dns_server.stop()
    http_server.status = 503

    data = await asyncio.wait_for(watcher.collect(), 5)

    assert data["dns"][NAME]["ok"] is False and data["dns"][NAME]["error"]
    assert data["http"][url] == {"ok": False, "latency_ms": data["http"][url]["latency_ms"],
                                 "status": 503, "error": "HTTP 503"}
    assert (data["dns_ok"], data["http_ok"]) == (False, False)


async def test_an_unknown_name_is_a_dns_failure(
    dns_server: LoopbackDns, http_server: LoopbackHttp
) -> None:
    watcher = NetworkWatcher(NetworkTargets(
        dns_names=("missing.test",), dns_servers=("127.0.0.1",), dns_port=dns_server.port,
        timeout_s=0.5))
    data = await asyncio.wait_for(watcher.collect(), 5)
    assert data["dns"]["missing.test"]["ok"] is False
    assert "NXDOMAIN" in data["dns"]["missing.test"]["error"]
    assert (data["dns_ok"], data["http_ok"]) == (False, None)  # None: no HTTP target


# -- network_watchdog through an engine ------------------------------------------------------


async def test_an_outage_is_announced_once_and_its_recovery_once(
    tmp_path: Path, dns_server: LoopbackDns, http_server: LoopbackHttp,
    open_engine: Callable[..., Any],
) -> None:
    samples = 2
    engine: Engine = await open_engine(
        tmp_path / "home", survival=SurvivalConfig(network=targets(dns_server, http_server,
                                                                   samples)))
    for _ in range(2):
        await engine.step()
    assert await network_notices(engine) == []

    dns_server.answering = False
    http_server.stop()
    for n in range(1, samples):
        await engine.step()
        assert await network_notices(engine) == [], f"announced after {n} failing sample(s)"
    await engine.step()
    (outage,) = await network_notices(engine)
    assert (outage["level"], outage["text"]) == (
        "outage", "network outage: DNS and HTTP failing")
    (notice,) = await notifications(engine, "network")
    assert (notice.data["level"], notice.origin) == ("outage", "survival")

    for _ in range(2):  # still down: nothing more to say
        await engine.step()
    assert [n["level"] for n in await network_notices(engine)] == ["outage"]

    dns_server.answering = True
    http_server.start()  # the same port again
    await engine.step()
    assert [n["level"] for n in await network_notices(engine)] == ["outage", "recovered"]
    for _ in range(2):
        await engine.step()
    assert [n["level"] for n in await network_notices(engine)] == ["outage", "recovered"]
    assert [e.data["level"] for e in await notifications(engine, "network")] == [
        "outage", "recovered"]
    acked = await engine.events.read(kinds=["effect-acked"])
    assert len(acked) >= 2 and not await engine.events.read(kinds=["effect-failed"])


async def test_a_second_outage_after_recovery_is_announced_again(
    tmp_path: Path, dns_server: LoopbackDns, http_server: LoopbackHttp,
    open_engine: Callable[..., Any],
) -> None:
    engine: Engine = await open_engine(
        tmp_path / "home",
        survival=SurvivalConfig(network=targets(dns_server, http_server, samples=1)))
    for up in (False, True, False, True):
        if up:
            dns_server.start()
            http_server.start()
        else:
            dns_server.stop()
            http_server.stop()
        await engine.step()
    assert [n["level"] for n in await network_notices(engine)] == [
        "outage", "recovered", "outage", "recovered"]


async def test_dns_down_alone_is_not_an_outage(
    tmp_path: Path, dns_server: LoopbackDns, http_server: LoopbackHttp,
    open_engine: Callable[..., Any],
) -> None:
    engine: Engine = await open_engine(
        tmp_path / "home", survival=SurvivalConfig(network=targets(dns_server, http_server)))
    dns_server.answering = False
    for _ in range(3):  # samples + 1
        await engine.step()
    latest = (await engine.vitals.latest(["network"]))["network"]
    assert (latest.data["dns_ok"], latest.data["http_ok"]) == (False, True)
    assert not network_outage(latest.data)
    assert await network_notices(engine) == []


async def test_http_down_alone_is_not_an_outage(
    tmp_path: Path, dns_server: LoopbackDns, http_server: LoopbackHttp,
    open_engine: Callable[..., Any],
) -> None:
    engine: Engine = await open_engine(
        tmp_path / "home", survival=SurvivalConfig(network=targets(dns_server, http_server)))
    http_server.stop()
    for _ in range(3):  # samples + 1
        await engine.step()
    latest = (await engine.vitals.latest(["network"]))["network"]
    assert (latest.data["dns_ok"], latest.data["http_ok"]) == (True, False)
    assert not network_outage(latest.data)
    assert await network_notices(engine) == []


async def test_an_announced_outage_is_not_announced_again_after_a_restart(
    tmp_path: Path, dns_server: LoopbackDns, http_server: LoopbackHttp,
    open_engine: Callable[..., Any],
) -> None:
    config = SurvivalConfig(network=targets(dns_server, http_server, samples=1))
    dns_server.stop()
    http_server.stop()
    first: Engine = await open_engine(tmp_path / "home", survival=config)
    await first.step()
    await first.close()

    second: Engine = await open_engine(tmp_path / "home", survival=config)
    await second.step()
    await second.step()
    assert [n["level"] for n in await network_notices(second)] == ["outage"]
    dns_server.start()
    http_server.start()
    await second.step()
    assert [n["level"] for n in await network_notices(second)] == ["outage", "recovered"]


# -- notify sinks ----------------------------------------------------------------------------


async def outage_engine(tmp_path: Path, dns: LoopbackDns, http: LoopbackHttp,
                        sinks: NotifySinks, open_engine: Callable[..., Any]) -> Engine:
    """An engine whose first step announces an outage (both servers already down)."""
    dns.answering = False
    http.stop()
    return await open_engine(tmp_path / "home", survival=SurvivalConfig(
        network=targets(dns, http, samples=1), notify=sinks))


async def test_a_notice_reaches_the_log_file_and_the_webhook_with_an_idempotency_key(
    tmp_path: Path, dns_server: LoopbackDns, http_server: LoopbackHttp,
    hook_server: LoopbackHttp, open_engine: Callable[..., Any],
) -> None:
    log = tmp_path / "notices" / "notify.log"
    engine = await outage_engine(
        tmp_path, dns_server, http_server,
        NotifySinks(log_file=str(log), webhook_url=hook_server.url("/hook"),
                    webhook_timeout_s=2), open_engine)
    await engine.step()

    (effect,) = [e for e in await engine.events.read(kinds=["effect"])
                 if e.data["effect"]["type"] == "notify"]
    (acked,) = await engine.events.read(kinds=["effect-acked"], key=effect.key)
    assert acked.data["result"] == {"delivered": ["event", "log", "webhook"]}

    (request,) = hook_server.requests
    assert (request.method, request.path) == ("POST", "/hook")
    body = request.json()
    assert (body["topic"], body["level"], body["text"]) == (
        "network", "outage", "network outage: DNS and HTTP failing")
    assert body["effect"] == effect.key
    assert request.headers["idempotency-key"] == f"{effect.key}:1"
    assert request.headers["content-type"] == "application/json"

    (line,) = log.read_text().splitlines()
    assert json.loads(line) == body


async def test_a_webhook_answering_500_fails_the_effect_and_the_retry_does_not_repeat_the_event(
    tmp_path: Path, dns_server: LoopbackDns, http_server: LoopbackHttp,
    hook_server: LoopbackHttp, open_engine: Callable[..., Any],
) -> None:
    hook_server.status = 500
    engine = await outage_engine(
        tmp_path, dns_server, http_server,
        NotifySinks(webhook_url=hook_server.url("/hook"), webhook_timeout_s=2), open_engine)
    await engine.step()

    (effect,) = [e for e in await engine.events.read(kinds=["effect"])
                 if e.data["effect"]["type"] == "notify"]
    (failed,) = await engine.events.read(kinds=["effect-failed"], key=effect.key)
    assert "WebhookFailed" in failed.data["error"] and "answered HTTP 500" in failed.data["error"]
    assert failed.data["attempt"] == 1 and failed.data["final"] is False
    assert not await engine.events.read(kinds=["effect-acked"], key=effect.key)
    assert len(await notifications(engine, "network")) == 1  # the event sink ran first
    assert len(hook_server.requests) == 1

    # the retry (after the executor's backoff, ~1 s) delivers, under a new idempotency key,
    # and does not append the notification event again
    hook_server.status = 200
    retry_at = failed.data["retry_at"]
    await asyncio.sleep(max(0, retry_at - engine.clock.now_ms()) / 1000 + 0.05)
    await engine.executor_loop.run_until_idle()
    (acked,) = await engine.events.read(kinds=["effect-acked"], key=effect.key)
    assert acked.data["result"]["delivered"] == ["event", "webhook"]
    assert [r.headers["idempotency-key"] for r in hook_server.requests] == [
        f"{effect.key}:1", f"{effect.key}:2"]
    assert len(await notifications(engine, "network")) == 1


async def test_http_only_targets_make_an_outage_when_http_fails(
    tmp_path: Path, http_server: LoopbackHttp, open_engine: Callable[..., Any],
) -> None:
    only_http = NetworkTargets(http_urls=(http_server.url("/health"),), timeout_s=0.3,
                               interval_s=1, samples=2)
    engine: Engine = await open_engine(tmp_path / "home",
                                       survival=SurvivalConfig(network=only_http))
    await engine.step()
    assert (await engine.vitals.latest(["network"]))["network"].data["dns_ok"] is None
    http_server.stop()
    for _ in range(3):
        await engine.step()
    assert [n["level"] for n in await network_notices(engine)] == ["outage"]
    assert "HTTP" in (await network_notices(engine))[0]["text"]
