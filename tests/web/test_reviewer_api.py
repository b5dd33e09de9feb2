"""The Reviewer API over real awareness cycles: a real engine runs the awareness layer against
the scripted chat-completions server on 127.0.0.1 (tests/adapters/awareness_rig.py), and the
page (the awareness layer's own, `Layer.ui`) reads what the cycles wrote — outcomes newest
first, accepted and rejected verbs with their reasons, narration and journal, reviews that ran
no cycle and why, the degradation state, model calls per day. One test goes through the UI's
own process, which learns the page from config.json."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from pulse_adapters.awareness import (
    AwarenessConfig,
    AwarenessReview,
    CycleRecord,
    Reviewer,
    build_reviewer,
    fingerprint,
)
from pulse_adapters.llm.stand_in import ChatServer, Status
from pulse_adapters.web import layer
from pulse_core import (
    Engine,
    EventDraft,
    LayerContext,
    ManualClock,
    MemoryBoard,
    SystemClock,
    identity_key,
)
from pulse_core._effects import effect_draft
from tests.adapters.awareness_rig import close_engine, open_engine, reply, settings
from tests.web.test_rules_api import served, ui_of

CITY = {"verb": "adjust_confidence", "target": "state:city", "delta": 0.2,
        "reason": "she said she stays"}
PROTECTED = {"verb": "retract", "target": "state:name", "reason": "names change"}


@dataclass
class Rig:
    engine: Engine
    board: MemoryBoard
    clock: ManualClock
    server: ChatServer
    http: httpx.AsyncClient

    async def review(self, *scripted: Any, exchange: str) -> None:
        """A new human exchange, then a tick a minute later and the reviews it asks for."""
        await self.board.exchange("ana", exchange)
        self.server.script(*scripted)
        self.clock.advance(60_000)
        await self.engine.vitals.record("llm-route", {"ok": True})
        await self.engine.tick()
        await self.engine.executor_loop.run_until_idle()

    async def page(self) -> dict[str, Any]:
        answer = await self.http.get("/api/pages/reviewer")
        assert answer.status_code == 200, answer.text
        found = answer.json()
        assert isinstance(found, dict)
        return found


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    with ChatServer() as server:
        yield server


@pytest.fixture
async def rig(tmp_path: Path, chat_server: ChatServer) -> AsyncIterator[Rig]:
    """The awareness layer in a real engine (ticks in the test's hands), the UI over it."""
    clock = ManualClock()
    home = tmp_path / "home"
    reviewer: Reviewer = build_reviewer(settings(chat_server, AwarenessConfig(initial_delay_s=30)),
                                        LayerContext(home, clock))
    engine, service = await open_engine(home, clock, reviewer)
    board = MemoryBoard(engine.events)
    await board.register("ana", "Ana")
    await board.set_state("ana", "city", "Lisbon", confidence=0.6)
    await board.set_state("ana", "name", "Ana", protected=True, immutable=("value",))
    try:
        async with ui_of(engine, has_directory=False) as http:
            yield Rig(engine, board, clock, chat_server, http)
    finally:
        await close_engine(engine, service)
        await reviewer.client.aclose()


async def test_cycles_come_newest_first_with_verbs_their_reasons_and_the_narration(
        rig: Rig) -> None:
    await rig.review(reply(change=True, narration="I see Ana is settling in Lisbon",
                           verbs=[CITY, PROTECTED]), exchange="I'll stay in Lisbon for good")
    await rig.review(Status(500), Status(500), exchange="actually, maybe Porto")
    page = await rig.page()
    failed, reviewed = page["cycles"]
    assert failed["outcome"] == "failed" and "HttpStatusError" in failed["error"]
    assert reviewed["outcome"] == "reviewed" and reviewed["reason"] == "changed"
    assert reviewed["narration"] == "I see Ana is settling in Lisbon"
    assert reviewed["accepted"][0]["target"] == "state:city"
    (rejection,) = reviewed["rejected"]
    assert "state:name" in rejection["proposal"] and rejection["reason"]
    accepted, rejected = page["verbs"]
    assert accepted["accepted"] is True and accepted["verb"] == "adjust_confidence"
    assert accepted["reason"] == "she said she stays" and accepted["change"] == 0.2
    assert rejected["accepted"] is False and rejected["reason"] == rejection["reason"]
    assert page["journal"][0]["narration"] == "I see Ana is settling in Lisbon"
    calls = failed["model_calls"] + reviewed["model_calls"]
    (today,) = page["days"]
    assert today["cycles"] == 2 and today["model_calls"] == calls
    assert today["outcomes"] == {"reviewed": 1, "failed": 1}
    assert today["accepted"] == 1 and today["rejected"] == 1
    used = [c.get("prompt_tokens", 0) for c in page["cycles"]]
    assert used[1] > 0  # the stand-in reports usage for the reviewed cycle's call
    assert today["prompt_tokens"] == sum(used) and today["completion_tokens"] > 0
    assert page["calls_today"] == calls
    (ana,) = page["identities"]
    assert ana["identity"] == "ana" and ana["last_outcome"] == "failed"
    assert ana["failures_in_a_row"] == 1 and ana["calls_today"] == calls
    assert page["degradation"] == {"degraded": False, "window_reviews": 1, "proposed": 2,
                                   "would_reject": 1, "rejection_rate": 0.5}
    assert page["kinds"] == ["awareness-cycle", "awareness-journal"]


async def test_mostly_rejected_proposals_show_the_reviewer_degraded_to_narration_only(
        rig: Rig) -> None:
    window = AwarenessConfig().degrade_window
    for n in range(window):
        await rig.review(reply(change=True, verbs=[PROTECTED]), exchange=f"news {n}")
    page = await rig.page()
    assert page["degradation"]["degraded"] is True
    assert page["degradation"]["rejection_rate"] == 1.0
    assert page["degradation"]["window_reviews"] == window
    await rig.review(reply(change=True, verbs=[CITY]), exchange="more news")
    newest = (await rig.page())["cycles"][0]
    assert newest["narration_only"] is True and newest["accepted"] == []


async def test_a_review_whose_world_was_reviewed_already_is_listed_with_why_it_ran_no_cycle(
        rig: Rig) -> None:
    exchange = await rig.board.exchange("ana", "I'll stay in Lisbon for good")
    memory = (await rig.engine.snapshot()).projection("memory")["ana"]
    review = AwarenessReview(identity="ana", fingerprint=fingerprint(memory),
                             source=str(exchange.data["record"]), reason="changed",
                             route="dedicated")
    for _ in range(2):  # asked twice, by two engines sharing the log, say
        await rig.engine.events.append([effect_draft(review, origin="rule:awareness")])
    rig.server.script(reply(delay_s=0.2), reply())
    await rig.engine.executor_loop.run_until_idle()
    page = await rig.page()
    (cycle,) = page["cycles"]
    (skipped,) = page["skipped"]
    assert skipped["identity"] == "ana" and skipped["asked_because"] == "changed"
    assert skipped["why"] == f"another review settled this world first (cycle #{cycle['seq']})"


async def test_over_http_the_ui_process_shows_the_page_of_the_configured_layer_only(
        tmp_path: Path, chat_server: ChatServer) -> None:
    home = tmp_path / "home"
    web = layer({"port": 0, "live_every_s": 0.2}, LayerContext(home, SystemClock()))
    async with Engine(home, layers=[web]):
        url, token = await served(home)
        async with httpx.AsyncClient(headers=token, timeout=30) as http:
            nav = (await http.get(url + "api/pages")).json()
            absent = await http.get(url + "api/pages/reviewer")
    (home / "config.json").write_text(json.dumps({"layers": {
        "web": {"port": 0}, "awareness": settings(chat_server, AwarenessConfig())}}))
    async with Engine(home, layers=[web]) as engine:  # built in code: the UI reads config.json
        earlier = CycleRecord(identity="ana", outcome="reviewed", reason="changed",
                              model_calls=1, narration="from the log")
        await engine.events.append([EventDraft(
            "awareness-cycle", identity_key("ana"), msgspec.to_builtins(earlier),
            origin="executor:awareness")])
        url, token = await served(home)
        async with httpx.AsyncClient(headers=token, timeout=30) as http:
            listed = (await http.get(url + "api/pages")).json()
            page = (await http.get(url + "api/pages/reviewer")).json()
            html = await http.get(url + "reviewer")
            script = await http.get(url + "pages/reviewer/reviewer.js")
            refused = await http.get(url + "api/pages/reviewer",
                                     headers={"authorization": "Bearer x"})
    assert "/reviewer" not in [p["path"] for p in nav["pages"]] and nav["problems"] == []
    assert absent.status_code == 404
    assert {"path": "/reviewer", "title": "Reviewer", "layer": "awareness"} in listed["pages"]
    assert page["cycles"][0]["narration"] == "from the log"  # folded in the UI's process
    assert page["days"][0]["model_calls"] == 1
    assert html.status_code == 200 and "/pages/reviewer/reviewer.js" in html.text
    assert script.status_code == 200 and "api/pages/reviewer" in script.text
    assert refused.status_code in (401, 403)
