"""The Rule chain API: the tiers in chain order with each rule's decision in the last tick,
the engine directory's promote and rollback history, and the rollback control — the
survival layer's Rollback effect, run by a real engine's executor on a real engine directory
(git), asked for through the real Guard with the token. One test serves the page from the
UI's own process on 127.0.0.1 (uvicorn), as the daemon does."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from pulse_adapters.web import WebSettings, build_app, layer, read_token
from pulse_adapters.web import _rules_rollback as rollback_module
from pulse_adapters.web._metrics import InstrumentReadings
from pulse_adapters.web._report import EngineReport, report_of
from pulse_adapters.web._view import EngineView
from pulse_cli.enginedir import GitEngineDirectory, init_engine_dir
from pulse_core import (
    Decision,
    Engine,
    Inner,
    Layer,
    LayerContext,
    Snapshot,
    SqliteEventStore,
    SystemClock,
)
from pulse_core._effects import effect_draft
from pulse_survival import Rollback
from tests.cli.support import git, promote_without_gate, stage_new_text
from tests.timing import scaled

TOKEN = "rules-test-token-" + "x" * 24
PORT = 8421
LIVE_S = scaled(30.0)
"""The bound of a wait on the UI's process, which runs niced (a hang, not a speed)."""
ELSEWHERE = "another-host.invalid"
"""A host no engine here runs as: a rollback bound to it stays pending."""


@dataclass
class Promoted:
    """A home with an engine directory and one promote on record."""

    home: Path
    previous: str
    revision: str

    def main(self) -> str:
        return git(self.home / "engine", "rev-parse", "HEAD")

    def tree(self, revision: str) -> str:
        return git(self.home / "engine", "rev-parse", f"{revision}^{{tree}}")


@pytest.fixture
async def promoted(tmp_path: Path) -> Promoted:
    home = tmp_path / "home"
    assert await asyncio.to_thread(init_engine_dir, home)
    previous = git(home / "engine", "rev-parse", "HEAD")
    stage_new_text(home / "staging")
    events = await SqliteEventStore.open(home / "events.db")
    try:
        revision = await promote_without_gate(home, events)
    finally:
        await events.close()
    return Promoted(home, previous, revision)


async def a_rule(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    """A business rule that passes the tick on."""
    return await inner(prev, curr)


@contextlib.asynccontextmanager
async def ui_of(engine: Engine, *, has_directory: bool,
                report: EngineReport | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The UI's app over `engine`'s stores (as the UI's process opens them) with the engine's
    report, called in-process through the Guard with the token."""
    view = EngineView.beside(engine)
    view.update(report or await report_of(engine, has_directory, InstrumentReadings()))
    app = build_app(view, WebSettings(port=PORT), TOKEN, PORT)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                 base_url=f"http://127.0.0.1:{PORT}", timeout=60,
                                 headers={"authorization": f"Bearer {TOKEN}"}) as http:
        yield http


async def served(home: Path) -> tuple[str, dict[str, str]]:
    """The address the home's web service serves on (HOME/web.json) and the token header."""
    for _ in range(600):
        if (home / "web.json").exists():
            url = json.loads((home / "web.json").read_text())["url"]
            return url, {"authorization": f"Bearer {read_token(home)}"}
        await asyncio.sleep(0.05)
    raise AssertionError("the web service did not write HOME/web.json within 30 s")


async def until(probe: Callable[[], Any], what: str) -> Any:
    """Await `probe()` until it gives something truthy (LIVE_S at most)."""
    try:
        async with asyncio.timeout(LIVE_S):
            while not (found := await probe()):  # noqa: ASYNC110 - other processes change it
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out after {LIVE_S:g} s waiting for {what}") from None
    return found


async def rollback_events(engine: Engine) -> list[Any]:
    return await engine.events.read(kinds=["rollback"])


async def effects(engine: Engine) -> list[Any]:
    return await engine.events.read(kinds=["effect"])


async def sees_the_trouble(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    raise RuntimeError("the layer's rule broke on purpose")


async def business_as_usual(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    return Decision([], 7_000)


# -- the chain and its history --------------------------------------------------------------

async def test_over_http_the_tiers_come_in_chain_order_with_each_rules_last_decision(
        promoted: Promoted) -> None:
    directory = GitEngineDirectory(promoted.home)
    web = layer({"port": 0, "live_every_s": 0.2},
                LayerContext(promoted.home, SystemClock(), directory))
    noter = Layer("noter", rules=[sees_the_trouble])
    async with Engine(promoted.home, layers=[web, noter], rules=[business_as_usual],
                      engine_directory=directory):
        url, token = await served(promoted.home)
        async with httpx.AsyncClient(headers=token, timeout=30) as http:
            async def ticked() -> dict[str, Any] | None:
                found = (await http.get(url + "api/rules")).json()
                return found if found["tick"]["number"] >= 1 and found["tiers"][0]["rules"] \
                    else None

            chain = await until(ticked, "the rule chain after the first tick")
            refused = await http.get(url + "api/rules", headers={"authorization": "Bearer no"})
    assert refused.status_code in (401, 403)
    tiers = {t["tier"]: t for t in chain["tiers"]}
    assert [(t["tier"], t["kind"]) for t in chain["tiers"]] == [
        ("survival", "survival"), ("builtin", "built-in"), ("web", "layer"),
        ("noter", "layer"), ("business", "business")]
    assert tiers["survival"]["fixed"] and not tiers["business"]["fixed"]
    assert "process_watchdog" in [r["rule"] for r in tiers["survival"]["rules"]]
    assert tiers["web"]["rules"] == []
    (broken,) = tiers["noter"]["rules"]
    assert broken["rule"] == "sees_the_trouble" and broken["reached"]
    assert "broke on purpose" in broken["error"]
    (business,) = tiers["business"]["rules"]
    assert business == {"rule": "business_as_usual", "reached": True, "effects": [],
                        "tick_ms": 7_000, "error": None}
    assert chain["has_directory"] is True
    (promote,) = chain["history"]
    assert promote["kind"] == "promote" and promote["revision"] == promoted.revision
    assert promote["previous"] == promoted.previous and promote["who"] == "cli"
    assert chain["last_good"]["revision"] == promoted.previous
    assert chain["stream"] == {"kinds": ["promote", "rollback"], "key": "engine-directory"}


async def test_before_the_first_tick_the_rules_are_listed_in_their_tiers_unreached(
        tmp_path: Path) -> None:
    engine = Engine(tmp_path / "home", rules=[a_rule])
    await engine.open()
    try:
        async with ui_of(engine, has_directory=False) as http:
            chain = (await http.get("/api/rules")).json()
    finally:
        await engine.close()
    by_tier = {t["tier"]: t for t in chain["tiers"]}
    assert [r["rule"] for r in by_tier["business"]["rules"]] == ["a_rule"]
    assert by_tier["survival"]["fixed"] and by_tier["survival"]["rules"]
    assert not any(r["reached"] for t in chain["tiers"] for r in t["rules"])
    assert chain["history"] == [] and chain["last_good"]["revision"] is None


# -- rollback ---------------------------------------------------------------------------------

async def test_a_rollback_to_the_last_known_good_revision_moves_main_and_records_why(
        promoted: Promoted) -> None:
    directory = GitEngineDirectory(promoted.home)
    async with Engine(promoted.home, engine_directory=directory) as engine, \
            ui_of(engine, has_directory=True) as http:
        elsewhere = Rollback(reason="another host's own rollback")
        (theirs,) = (await engine.events.append([effect_draft(elsewhere, "agent",
                                                              host=ELSEWHERE)])).events
        answer = await http.post("/api/rollback",
                                 json={"revision": None, "reason": "the promote broke it"})
        assert answer.status_code == 200, answer.text
        done = answer.json()
        (event,) = await rollback_events(engine)
        chain = (await http.get("/api/rules")).json()
        again = await http.post("/api/rollback", json={"revision": None, "reason": "twice"})
        assert again.status_code == 200, again.text
        events_after = await rollback_events(engine)
    assert done["status"] == "acked" and done["origin"] == "human:web"
    assert theirs.key != done["id"]
    assert event.data["reason"] == "the promote broke it"
    assert event.data["to"] == promoted.previous
    assert promoted.main() == event.data["revision"] == done["rollback"]["revision"]
    assert promoted.tree(promoted.main()) == promoted.tree(promoted.previous)
    newest = chain["history"][0]
    assert newest["kind"] == "rollback" and newest["reason"] == "the promote broke it"
    assert newest["asked_by"] == "human:web" and newest["effect"] == done["id"]
    assert [h["kind"] for h in chain["history"]] == ["rollback", "promote"]
    assert [r["id"] for r in chain["requests"]] == [done["id"]]  # not the other host's
    # main already has the last good revision's files: nothing is committed or recorded
    assert again.json()["rollback"] is None and again.json()["status"] == "acked"
    assert len(events_after) == 1 and promoted.main() == event.data["revision"]


async def test_the_last_good_rollback_is_offered_only_while_it_would_change_main(
        promoted: Promoted, tmp_path: Path) -> None:
    directory = GitEngineDirectory(promoted.home)
    async with Engine(promoted.home, engine_directory=directory) as engine, \
            ui_of(engine, has_directory=True) as http:
        before = (await http.get("/api/rules")).json()["last_good"]
        answer = await http.post("/api/rollback", json={"revision": None, "reason": "broke"})
        assert answer.status_code == 200, answer.text
        after = (await http.get("/api/rules")).json()["last_good"]
    assert before["possible"] is True and before["why_not"] is None
    assert after["revision"] == promoted.previous and after["possible"] is False
    assert after["why_not"].startswith(f"main already has the files of {promoted.previous[:12]}")

    fresh = tmp_path / "fresh"  # `upulse init`'s engine directory: one commit, no promote
    assert await asyncio.to_thread(init_engine_dir, fresh)
    async with Engine(fresh, engine_directory=GitEngineDirectory(fresh)) as engine, \
            ui_of(engine, has_directory=True) as http:
        single = (await http.get("/api/rules")).json()["last_good"]
        git(fresh / "engine", "commit", "-q", "--allow-empty", "-m", "a second commit")
        two = (await http.get("/api/rules")).json()["last_good"]
    assert single["revision"] is None and single["possible"] is False
    assert "main has a single commit" in single["why_not"]
    assert two["possible"] is True and two["why_not"] is None


async def test_a_rollback_to_a_revision_main_lacks_is_refused_with_what_git_said(
        promoted: Promoted) -> None:
    directory = GitEngineDirectory(promoted.home)
    async with Engine(promoted.home, engine_directory=directory) as engine, \
            ui_of(engine, has_directory=True) as http:
        answer = await http.post("/api/rollback",
                                 json={"revision": "f" * 40, "reason": "a typo"})
        assert await rollback_events(engine) == []
    assert answer.status_code == 409, answer.text
    assert "no such revision" in answer.json()["error"]
    assert answer.json()["effect"]
    assert promoted.main() == promoted.revision


async def test_without_an_engine_directory_a_rollback_is_refused_and_nothing_is_written(
        tmp_path: Path) -> None:
    async with Engine(tmp_path / "home") as engine, ui_of(engine, has_directory=False) as http:
        answer = await http.post("/api/rollback", json={"revision": None, "reason": "why not"})
        chain = (await http.get("/api/rules")).json()
        assert await effects(engine) == []
    assert answer.status_code == 409
    assert "without an engine directory" in answer.json()["error"]
    assert chain["has_directory"] is False


async def test_a_second_rollback_while_one_is_unfinished_is_refused_naming_it(
        promoted: Promoted, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rollback_module, "ROLLBACK_WAIT_S", 0.5)
    engine = Engine(promoted.home, engine_directory=GitEngineDirectory(promoted.home))
    await engine.open()  # not started: no executor runs the effect, it stays pending
    try:
        async with ui_of(engine, has_directory=True) as http:
            body = {"revision": None, "reason": "at once"}
            both = await asyncio.gather(http.post("/api/rollback", json=body),
                                        http.post("/api/rollback", json=body))
            later = await http.post("/api/rollback", json=body)
            asked = await effects(engine)
    finally:
        await engine.close()
    assert sorted(a.status_code for a in both) == [202, 409]
    first = next(a for a in both if a.status_code == 202).json()
    assert first["status"] == "pending" and first["finished"] is False
    assert "under way" in next(a for a in both if a.status_code == 409).json()["error"]
    assert later.status_code == 409 and later.json()["effect"] == first["id"]
    assert [e.key for e in asked] == [first["id"]]


@pytest.mark.parametrize(("body", "said"), [
    (b"{not json", "not JSON"),
    (b"[]", "JSON object"),
    (b'{"revision": null}', "`reason` is required"),
    (b'{"revision": null, "reason": "   "}', "`reason` is required"),
    (b'{"revision": "main branch", "reason": "x"}', "is not a revision"),
    (b'{"revision": 7, "reason": "x"}', "is not a revision"),
    (b'{"to": "abc", "reason": "x"}', "unknown field(s) to"),
])
async def test_a_bad_rollback_request_says_what_to_send_and_writes_nothing(
        promoted: Promoted, body: bytes, said: str) -> None:
    engine = Engine(promoted.home, engine_directory=GitEngineDirectory(promoted.home))
    await engine.open()
    try:
        async with ui_of(engine, has_directory=True) as http:
            answer = await http.post("/api/rollback", content=body,
                                     headers={"content-type": "application/json"})
            unguarded = await http.post("/api/rollback", json={"reason": "x"},
                                        headers={"authorization": "Bearer wrong"})
            assert await effects(engine) == []
    finally:
        await engine.close()
    assert answer.status_code == 400
    assert said in answer.json()["error"]
    assert unguarded.status_code in (401, 403)


async def test_over_http_a_rollback_from_the_uis_own_process_moves_main(
        promoted: Promoted) -> None:
    directory = GitEngineDirectory(promoted.home)
    web = layer({"port": 0, "live_every_s": 0.2},
                LayerContext(promoted.home, SystemClock(), directory))
    async with Engine(promoted.home, layers=[web], engine_directory=directory) as engine:
        url, token = await served(promoted.home)
        async with httpx.AsyncClient(headers=token, timeout=60) as http:
            await until(lambda: _has_directory(http, url), "the engine's report")
            answer = await http.post(url + "api/rollback",
                                     json={"revision": None, "reason": "from the UI process"})
        assert answer.status_code == 200, answer.text
        (event,) = await rollback_events(engine)
    assert event.data["reason"] == "from the UI process"
    assert promoted.main() == event.data["revision"] == answer.json()["rollback"]["revision"]


async def _has_directory(http: httpx.AsyncClient, url: str) -> bool:
    return bool((await http.get(url + "api/rules")).json()["has_directory"])
