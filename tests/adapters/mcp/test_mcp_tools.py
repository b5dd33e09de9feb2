"""The watch, commitment, notice and decision tools of `upulse mcp`, called through the SDK's
own client over stdio and over HTTP: what they store is read back from the log, and a refused
call stores nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession

from pulse_adapters.mcp import McpSettings
from pulse_adapters.mcp._calls import RETRY_WINDOW_S, Calls
from pulse_core import (
    ManualClock,
    Projector,
    SqliteEventStore,
    SystemClock,
    effect_draft,
    open_home,
)
from pulse_core.maintenance import (
    WatchArmed,
    WatchCondition,
    Watches,
    arm_watch,
    evaluate_watches,
)
from pulse_survival import Notify
from tests.adapters.hermes.rig import read_events
from tests.adapters.mcp.rig import events, make_home, session_over, text
from tests.cli.runner import Upulse


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    """The transport the SDK's client reaches `upulse mcp` over."""
    return str(request.param)


async def _refused(session: ClientSession, tool: str, arguments: dict[str, Any],
                   field: str) -> None:
    result = await session.call_tool(tool, arguments)
    assert result.isError, (tool, arguments, text(result))
    assert field in text(result), text(result)


async def _ok(session: ClientSession, tool: str, arguments: dict[str, Any]) -> str:
    result = await session.call_tool(tool, arguments)
    assert not result.isError, (tool, arguments, text(result))
    return text(result)


async def _fire_watches(home: Path) -> list[str]:
    """Evaluate the home's armed watches as maintenance does; the ids of those that fired."""
    stores = await open_home(home)
    try:
        projection = Watches()
        states = await Projector(stores.events, [projection]).catch_up()
        done = await evaluate_watches(stores.events, states[projection.name], 0,
                                      SystemClock().now_ms(), origin="engine")
        return [f.watch_id for f in done.fired]
    finally:
        await stores.close()


async def test_a_watch_is_armed_and_disarmed_as_the_agent(upulse: Upulse, transport: str,
                                                          tmp_path: Path) -> None:
    home = make_home(upulse, tmp_path)
    stores = await open_home(home)
    try:  # a person's watch, which the agent may not disarm or take over
        await arm_watch(stores.events, "theirs", WatchArmed(
            watch_class="delta", condition=WatchCondition(key_prefix="identity:ana")),
            origin="human")
    finally:
        await stores.close()
    async with session_over(transport, upulse, home) as session:
        for arguments, field in [
            ({"watch_id": "theirs", "identity": "ana"}, "watch_id"),       # a person's id
            ({"watch_id": "w:1", "identity": "ana"}, "watch_id"),          # not an id
            ({"watch_id": "w1", "identity": "bob"}, "identity"),           # unknown identity
            ({"watch_id": "w1", "kinds": ["no-such-kind"]}, "kinds"),      # unknown kind
            ({"watch_id": "w1"}, "identity"),                              # matches anything
            ({"watch_id": "w1", "identity": "ana", "watch_class": "silence"},
             "due_in_minutes"),                                            # silence, no due
            ({"watch_id": "w1", "identity": "ana", "produces": "mail"}, "produces"),
            ({"watch_id": "w1", "identity": "ana", "reason": "x" * 5000}, "reason"),
        ]:
            await _refused(session, "arm_watch", arguments, field)
        assert [e.origin for e in await events(home, "watch-armed")] == ["human"]
        await _ok(session, "arm_watch", {"watch_id": "ana-news", "identity": "ana",
                                         "kinds": ["temporal-fact-recorded"],
                                         "reason": "tell me what ana says"})
        await _refused(session, "arm_watch", {"watch_id": "ana-news", "identity": "ana"},
                       "watch_id")
        await _ok(session, "arm_watch", {"watch_id": "quiet", "identity": "ana",
                                         "watch_class": "silence", "due_in_minutes": 60})
        await _ok(session, "disarm_watch", {"watch_id": "quiet", "reason": "not needed"})
        await _refused(session, "disarm_watch", {"watch_id": "quiet"}, "watch_id")
        await _refused(session, "disarm_watch", {"watch_id": "never"}, "watch_id")
        mine = await session.call_tool("disarm_watch", {"watch_id": "theirs"})
        assert mine.isError and "another writer" in text(mine), text(mine)
    armed = [e for e in await events(home, "watch-armed", "watch-disarmed")
             if e.origin != "human"]
    assert [(e.kind, e.key, e.origin) for e in armed] == [
        ("watch-armed", "watch:ana-news", "agent:ada"),
        ("watch-armed", "watch:quiet", "agent:ada"),
        ("watch-disarmed", "watch:quiet", "agent:ada")]
    condition = armed[0].data["condition"]
    assert (condition["key_prefix"], condition["kinds"]) == ("identity:ana",
                                                             ["temporal-fact-recorded"])
    assert armed[1].data["due_at"] > armed[1].ts


async def test_a_fired_watch_is_answered_once(upulse: Upulse, transport: str,
                                                 tmp_path: Path) -> None:
    home = make_home(upulse, tmp_path)
    async with session_over(transport, upulse, home) as session:
        await _ok(session, "arm_watch", {"watch_id": "ana-news", "identity": "ana",
                                         "kinds": ["temporal-fact-recorded"],
                                         "reason": "tell me what ana says"})
        await _refused(session, "answer_decision", {"watch_id": "ana-news", "decision": "act"},
                       "watch_id")  # armed, not fired: nothing to decide yet
        await _ok(session, "remember", {"identity": "ana", "text": "ana got a dog"})
        assert await _fire_watches(home) == ["ana-news"]
        listed = json.loads(await _ok(session, "list_notices", {}))
        assert listed["decisions"] == [{"watch": "ana-news", "fired": listed["decisions"][0][
            "fired"], "reason": "tell me what ana says"}]
        await _refused(session, "answer_decision", {"watch_id": "ana-news",
                                                    "decision": "maybe"}, "decision")
        said = await _ok(session, "answer_decision", {"watch_id": "ana-news", "decision": "ask",
                                                      "reason": "ask ana about the dog"})
        assert "recorded" in said
        again = await _ok(session, "answer_decision", {"watch_id": "ana-news",
                                                       "decision": "ask"})
        assert "nothing changed" in again
        conflict = await session.call_tool("answer_decision", {"watch_id": "ana-news",
                                                               "decision": "act"})
        assert conflict.isError and "answer_decision: decision: " in text(conflict)
        assert "'ask'" in text(conflict) and "agent:ada" in text(conflict)
        assert json.loads(await _ok(session, "list_notices", {}))["decisions"] == []
    decided = await events(home, "watch-decided")
    assert [(e.key, e.origin, e.data["decision"]) for e in decided] == [
        ("watch:ana-news", "agent:ada", "ask")]


async def test_a_commitment_is_recorded_and_closed(upulse: Upulse, transport: str,
                                                   tmp_path: Path) -> None:
    home = make_home(upulse, tmp_path)
    async with session_over(transport, upulse, home) as session:
        for arguments, field in [
            ({"identity": "bob", "text": "call bob"}, "identity"),
            ({"identity": "ana", "text": ""}, "text"),
            ({"identity": "ana", "text": "call ana", "impact": "huge"}, "impact"),
            ({"identity": "ana", "text": "call ana", "due_in_minutes": 0}, "due_in_minutes"),
            ({"identity": "ana", "text": ["call ana"]}, "text"),
        ]:
            await _refused(session, "record_commitment", arguments, field)
        assert await events(home, "commitment-made") == []
        made = await _ok(session, "record_commitment", {"identity": "ana",
                                                        "text": "send ana the photos",
                                                        "due_in_minutes": 1440})
        commitment = made.split()[1]
        await _refused(session, "close_commitment", {"identity": "ana", "commitment": "c-none"},
                       "commitment")
        await _refused(session, "close_commitment", {"identity": "ana",
                                                     "commitment": commitment,
                                                     "status": "forgotten"}, "status")
        await _ok(session, "close_commitment", {"identity": "ana", "commitment": commitment,
                                                "reason": "sent them"})
        again = await _ok(session, "close_commitment", {"identity": "ana",
                                                        "commitment": commitment})
        assert "nothing changed" in again
        await _refused(session, "close_commitment", {"identity": "ana",
                                                     "commitment": commitment,
                                                     "status": "cancelled"}, "status")
    stored = await events(home, "commitment-made", "commitment-updated")
    assert [(e.kind, e.data["record"], e.origin) for e in stored] == [
        ("commitment-made", commitment, "agent:ada"),
        ("commitment-updated", commitment, "agent:ada")]
    assert stored[1].data["status"] == "fulfilled"


async def test_a_notice_acknowledged_is_not_listed_again(upulse: Upulse, transport: str,
                                                         tmp_path: Path) -> None:
    home = make_home(upulse, tmp_path)
    stores = await open_home(home)
    try:
        first, second = [(await stores.events.append([effect_draft(Notify(
            topic="agent-notices.task", level="info", text=f"sleep task t{n} completed"),
            origin="engine")])).events[0].key for n in (1, 2)]
    finally:
        await stores.close()
    async with session_over(transport, upulse, home) as session:
        listed = json.loads(await _ok(session, "list_notices", {}))["notices"]
        assert [n["id"] for n in listed] == [second, first]
        assert listed[0]["topic"] == "agent-notices.task"
        assert "sleep task t2 completed" in listed[0]["text"]
        await _refused(session, "ack_notice", {"notice_id": "no-such-notice"}, "notice_id")
        await _refused(session, "list_notices", {"limit": 0}, "limit")
        await _ok(session, "ack_notice", {"notice_id": first})
        assert "nothing changed" in await _ok(session, "ack_notice", {"notice_id": first})
        listed = json.loads(await _ok(session, "list_notices", {}))["notices"]
        assert [n["id"] for n in listed] == [second]
    acked = await events(home, "mcp-notice-acked")
    assert [(e.key, e.origin, e.data) for e in acked] == [
        (f"mcp-notice:ada:{first}", "agent:ada", {"effect": first})]


async def test_a_memory_call_made_again_is_answered_as_before_and_stored_once(
        upulse: Upulse, tmp_path: Path) -> None:
    """A remember or record_commitment whose answer was lost, made again (here by two
    server processes at once, as an agent's retry can race its first call), stores one
    event and gives both callers the same answer; another text is a new write."""
    home = make_home(upulse, tmp_path)
    async with session_over("stdio", upulse, home) as one, \
            session_over("stdio", upulse, home) as two:
        for tool, arguments in [
            ("remember", {"identity": "ana", "text": "ana keeps bees"}),
            ("record_commitment", {"identity": "ana", "text": "send ana the honey recipe",
                                   "due_in_minutes": 60}),
        ]:
            answers = await asyncio.gather(_ok(one, tool, arguments), _ok(two, tool, arguments))
            assert answers[0] == answers[1], answers
            assert await _ok(one, tool, arguments) == answers[0]
        other = await _ok(one, "remember", {"identity": "ana", "text": "ana keeps goats"})
        due_later = await _ok(one, "record_commitment", {
            "identity": "ana", "text": "send ana the honey recipe", "due_in_minutes": 600})
    facts = await read_events(home, kinds=["temporal-fact-recorded"])  # text opened
    assert [e.data["text"] for e in facts] == ["ana keeps bees", "ana keeps goats"]
    assert facts[1].data["record"] in other
    made = await read_events(home, kinds=["commitment-made"])
    assert [e.data["text"] for e in made] == ["send ana the honey recipe"] * 2
    assert made[1].data["record"] in due_later


async def test_the_same_memory_call_past_the_retry_window_is_a_new_write(
        tmp_path: Path) -> None:
    clock = ManualClock(1_700_000_000_000)
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    try:
        calls = Calls(store, McpSettings(agent="ada"), clock=clock)
        body = {"record": "f-1", "text": "ana keeps bees"}

        async def remember() -> tuple[int, bool]:
            event, new = await calls.write_once(
                "ana", "temporal-fact-recorded", body,
                lambda data: data.get("text") == body["text"])
            return event.seq, new

        first = await remember()
        clock.advance(RETRY_WINDOW_S * 1000)
        assert await remember() == (first[0], False)  # the window's last moment: a retry
        clock.advance(1)
        later = await remember()
        assert later[1] and later[0] > first[0]
    finally:
        await store.close()
