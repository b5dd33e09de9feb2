"""The agent-notices layer in a real Engine on a real SQLite home: a fired watch, a watch
that asks for a decision and a finished sleep task each become one Notify, once; sources
switched off stay quiet; wrong settings are refused naming the field; and a fired watch
reaches the model's next request through the real Hermes with the pulse plugin."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pulse_adapters.agents import (
    AgentNoticesError,
    agent_notice,
    fence_untrusted,
    notices_layer,
    open_notice,
)
from pulse_adapters.agents._notices import UNREADABLE_TEXT
from pulse_adapters.hermes import NoticeFollower
from pulse_adapters.llm.stand_in import ChatServer, Stream
from pulse_adapters.maintenance import run_cycle
from pulse_adapters.openclaw import notice_text as openclaw_notice_text
from pulse_core import Clock, Engine, EventDraft, LayerContext, ManualClock, SystemClock, load_layer
from pulse_core.maintenance import WatchArmed, WatchCondition, arm_watch
from pulse_core.memory import identity_key
from pulse_core.store import ElementKeys, is_sealed
from tests.adapters.hermes.rig import chat_requests, hermes_rig

HOUR = 3_600_000
DAY = 24 * HOUR
TEST_TIME_LIMIT_S = 300  # bounds a hang only: one hermes run, bounded by HermesRig.run


def engine(home: Path, settings: Any = None, clock: Clock | None = None) -> Engine:
    """An engine running the agent-notices layer; its loops are the test's (step)."""
    clock = clock or ManualClock()
    built = notices_layer(settings, LayerContext(home, clock))
    return Engine(home, layers=[built], clock=clock, drain_timeout=0.0)


async def notices(engine: Engine) -> list[dict[str, Any]]:
    events = await engine.events.read(kinds=["effect"])
    return [e.data["effect"] for e in events if e.data["effect"].get("type") == "notify"
            and e.data["effect"]["topic"].startswith("agent-notices.")]


async def fire_watch(engine: Engine, watch_id: str = "disk") -> None:
    await arm_watch(engine.events, watch_id, WatchArmed(
        watch_class="delta", condition=WatchCondition(kinds=("log-line",)),
        reason="the deploy log shows an error"), origin="cli")
    await engine.events.append([EventDraft(
        "watch-fired", f"watch:{watch_id}",
        {"trigger_seq": 1, "due_at": None, "produced": "sleep-1"}, origin="cli")])


def overdue(commitment: str, text: str) -> EventDraft:
    """The observation the maintenance cycle's commitment review records for an overdue
    commitment (pulse_adapters.maintenance, step 9)."""
    return EventDraft("observation-recorded", identity_key("owner"), {
        "record": f"o-overdue-{commitment}", "source": "maintenance",
        "key": "commitment-overdue", "severity": "warning", "routine": False,
        "value": {"commitment": commitment, "text": text, "due_at": 1, "status": "pending"}},
        origin="cli")


async def test_each_source_event_becomes_one_notice_once(tmp_path: Path) -> None:
    e = engine(tmp_path / "home")
    await e.open()
    try:
        await fire_watch(e)
        await e.events.append([
            EventDraft("watch-decided", "watch:disk",
                       {"decision": "ask", "reason": "restart the deploy?"}, origin="cli"),
            EventDraft("watch-decided", "watch:disk", {"decision": "silence"}, origin="cli"),
            overdue("c1", "send the weekly report"),
            EventDraft("observation-recorded", identity_key("owner"), {
                "record": "o-2", "source": "disk", "key": "usage", "value": 97},
                origin="cli"),
            EventDraft("sleep-task-completed", "sleep:t1",
                       {"by": "w", "outcome": "found 3 stale notes"}, origin="cli"),
            EventDraft("sleep-task-failed", "sleep:t2", {"by": "w", "reason": "no model"},
                       origin="cli")])
        await e.step()
        await e.step()  # a second tick tells nothing again
        got = await notices(e)
    finally:
        await e.close()
    assert [(n["topic"], n["text"] + "".join(f": {q['text']}" for q in n.get("quoted", ())))
            for n in got] == [
        ("agent-notices.watch",
         "watch disk fired on a change (event #1) (the deploy log shows an error)"),
        ("agent-notices.decision", "watch disk needs your decision: restart the deploy?"),
        ("agent-notices.commitment", "commitment c1 is overdue: send the weekly report"),
        ("agent-notices.task", "sleep task t1 completed: found 3 stale notes"),
        ("agent-notices.task", "sleep task t2 failed: no model"),
    ]
    assert all(n["level"] == "info" for n in got)


async def test_sources_switched_off_stay_quiet_and_the_level_is_set(tmp_path: Path) -> None:
    e = engine(tmp_path / "home", {"sources": ["task"], "level": "warning"})
    await e.open()
    try:
        await fire_watch(e)
        await e.events.append([EventDraft("sleep-task-completed", "sleep:t1",
                                          {"by": "w", "outcome": {"n": 2}}, origin="cli")])
        await e.step()
        got = await notices(e)
    finally:
        await e.close()
    assert [(n["topic"], n["level"], n["text"], [q["text"] for q in n["quoted"]])
            for n in got] == [
        ("agent-notices.task", "warning", "sleep task t1 completed", ['{"n": 2}'])]


@pytest.mark.parametrize(("settings", "named"), [
    ({"sources": ["watch", "mail"]}, "mail"),
    ({"level": "loud"}, "loud"),
    ({"sourcez": []}, "sourcez"),
    ([1], "JSON object"),
])
def test_wrong_settings_are_refused_naming_what_is_wrong(
        tmp_path: Path, settings: Any, named: str) -> None:
    with pytest.raises(AgentNoticesError, match=named):
        notices_layer(settings, LayerContext(tmp_path, ManualClock()))


def test_the_layer_is_found_through_its_entry_point(tmp_path: Path) -> None:
    built = load_layer("agent-notices", None, LayerContext(tmp_path, ManualClock()))
    assert built.name == "agent-notices"


def test_a_quoted_part_is_a_fenced_quote_cut_and_with_urls_redacted() -> None:
    notice = agent_notice("task", "info", "sleep task t1 completed",
                          "see https://hooks.example/secret-token " + "x" * 1000)
    assert notice.text == "sleep task t1 completed"
    (quote,) = notice.quoted
    assert quote.source == "agent-notices.task"
    assert "secret-token" not in quote.text
    assert len(quote.text) < 500
    assert fence_untrusted(quote).startswith("<<<quoted ")


async def test_a_fired_watch_reaches_the_models_next_request_through_hermes(
        tmp_path: Path, chat_server: ChatServer) -> None:
    pulse = tmp_path / "pulse"
    e = engine(pulse, clock=SystemClock())  # the plugin offers notices of the last hours
    await e.open()
    try:
        await fire_watch(e, "deploy")
        await e.step()
    finally:
        await e.close()
    rig = hermes_rig(tmp_path, chat_server, plugin=True)
    chat_server.script(Stream(("ok",)))
    done, _ = await asyncio.to_thread(rig.run, "-z", "anything new?", "-t", "todo",
                                      PULSE_HOME=str(pulse))
    assert done.returncode == 0, done.stderr
    turn = [m for m in chat_requests(chat_server)[0]["messages"] if m["role"] == "user"][-1]
    assert "watch deploy fired on a change" in json.dumps(turn["content"])
    assert "agent-notices.watch" in json.dumps(turn["content"])


async def test_an_overdue_commitment_of_a_sealed_home_reaches_the_agent_in_plain_words(
        tmp_path: Path) -> None:
    """The commitment's text is sealed in the home: the notice in the log quotes the sealed
    token (a purge still erases it), and what a host shows the agent is the opened text."""
    words = "call Ana back about the lease"
    clock = ManualClock()
    e = engine(tmp_path / "home", clock=clock)
    await e.open()
    try:
        await e.events.append([EventDraft("commitment-made", identity_key("ana"), {
            "record": "c-call", "text": words, "due_at": clock.now_ms() + HOUR},
            origin="agent")])
        (made,) = await e.events.read(kinds=["commitment-made"])
        assert is_sealed(made.data["text"])  # the home seals element text
        clock.advance(2 * HOUR)
        report = await run_cycle(e.events, clock=clock, cycle="c1")
        assert report.overdue == ("ana/c-call",)
        await e.step()
        (notice,) = await notices(e)
        hermes = await NoticeFollower(["notify"], max_age_ms=DAY).claim(
            e.events, clock.now_ms())
        openclaw = openclaw_notice_text(open_notice(notice, e.events.keys))
    finally:
        await e.close()
    assert notice["topic"] == "agent-notices.commitment"
    assert notice["text"] == "commitment ana/c-call is overdue"
    assert words not in json.dumps(notice)  # the log holds no plain copy
    assert [q["text"] for q in notice["quoted"]] == [made.data["text"]]
    for shown in (*hermes, openclaw):
        assert "commitment ana/c-call is overdue" in shown and words in shown
        assert "pulse-sealed" not in shown  # no part of the token


def test_sealed_text_that_does_not_open_is_shown_as_such(tmp_path: Path) -> None:
    keys = ElementKeys(tmp_path / "keys.db")
    token = keys.seal("ana/c-call", "call Ana back")
    notice = msgspec.to_builtins(agent_notice("commitment", "info", "commitment overdue",
                                              token))
    assert notice["quoted"][0]["text"] == token  # whole, not cut: it must still open
    assert open_notice(notice, keys)["quoted"][0]["text"] == "call Ana back"
    other = ElementKeys(tmp_path / "other-keys.db")
    assert open_notice(notice, other)["quoted"][0]["text"] == UNREADABLE_TEXT
    assert open_notice(notice, None)["quoted"][0]["text"] == UNREADABLE_TEXT
