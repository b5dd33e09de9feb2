"""`upulse mcp` as a real subprocess, driven by the MCP SDK's own client over stdio: what an
agent remembers lands in pulse's log as that agent, and refused calls store nothing."""

from __future__ import annotations

import json
from pathlib import Path

from tests.adapters.mcp.rig import events as _events
from tests.adapters.mcp.rig import make_home as _home
from tests.adapters.mcp.rig import stdio_session
from tests.adapters.mcp.rig import text as _text
from tests.cli.runner import Upulse, agent_then_feed, name_import_origins


async def test_remember_then_recall_through_the_sdk_client(upulse: Upulse,
                                                           tmp_path: Path) -> None:
    home = _home(upulse, tmp_path)
    async with stdio_session(upulse, home) as session:
        names = {t.name for t in (await session.list_tools()).tools}
        assert {"remember", "recall"} <= names
        done = await session.call_tool("remember", {"identity": "ana",
                                                    "text": "ana moved to Porto in May"})
        assert not done.isError, _text(done)
        found = await session.call_tool("recall", {"identity": "ana", "query": "porto"})
        assert "ana moved to Porto in May" in _text(found)
        missing = await session.call_tool("recall", {"identity": "ana", "query": "berlin"})
        assert "Porto" not in _text(missing)
    facts = await _events(home, "temporal-fact-recorded")
    assert [e.origin for e in facts] == ["agent:ada"]


async def test_recall_ranks_what_the_homes_import_origins_wrote_below_the_agents_word(
        upulse: Upulse, tmp_path: Path) -> None:
    home = _home(upulse, tmp_path)
    await agent_then_feed(home, "Porto, by the river", "Porto, the old town")
    name_import_origins(home, "agent:rss")
    async with stdio_session(upulse, home) as session:
        found = _text(await session.call_tool("recall", {"identity": "ana", "query": "porto"}))
    assert found.index("by the river") < found.index("the old town"), found


async def test_refusals_name_the_field_and_store_nothing(upulse: Upulse,
                                                         tmp_path: Path) -> None:
    home = _home(upulse, tmp_path, max_text=100, calls_per_minute=3)
    async with stdio_session(upulse, home) as session:
        refusals = [
            ({"identity": "ana", "text": 42}, "text"),                   # a bad field
            ({"identity": "bob", "text": "bob likes tea"}, "identity"),  # unknown identity
            ({"identity": "ana", "text": "x" * 101}, "text"),            # oversize
            ({"identity": "ana"}, "text"),                               # missing
        ]
        for arguments, field in refusals:
            result = await session.call_tool("remember", arguments)
            assert result.isError, arguments
            assert field in _text(result), _text(result)
        assert await _events(home, "temporal-fact-recorded") == []
        # calls_per_minute=3: the two refusals that reached the tool and this one count
        result = await session.call_tool("remember", {"identity": "ana", "text": "ok"})
        assert not result.isError, _text(result)
        limited = await session.call_tool("remember", {"identity": "ana", "text": "one more"})
        assert limited.isError
        assert "rate" in _text(limited)
    assert len(await _events(home, "temporal-fact-recorded")) == 1
    refused = await _events(home, "mcp-call-refused")
    assert [e.origin for e in refused] == ["agent:ada"]
    assert refused[0].data["tool"] == "remember"


async def test_without_an_mcp_section_the_server_says_what_to_set(upulse: Upulse,
                                                                   tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    done = upulse("mcp", "--home", home, ok=False)
    assert done.returncode != 0
    assert "`mcp`" in done.stderr and "agent" in done.stderr


async def test_a_task_created_over_mcp_is_on_the_board(upulse: Upulse, tmp_path: Path) -> None:
    home = _home(upulse, tmp_path)
    async with stdio_session(upulse, home) as session:
        done = await session.call_tool("create_task", {"task_id": "t-1", "title": "tidy notes",
                                                       "priority": 2})
        assert not done.isError, _text(done)
        # the same call again (its answer lost): the task it created, not an error
        retried = await session.call_tool("create_task", {"task_id": "t-1",
                                                          "title": "tidy notes", "priority": 2})
        assert not retried.isError and _text(retried) == _text(done)
        again = await session.call_tool("create_task", {"task_id": "t-1", "title": "other"})
        assert again.isError and "task_id" in _text(again)
        state = await session.call_tool("task_state", {"task_id": "t-1"})
        assert json.loads(_text(state))["status"] == "pending"
        unknown = await session.call_tool("task_state", {"task_id": "t-2"})
        assert unknown.isError and "task_id" in _text(unknown)
        report = await session.call_tool("maintenance_report", {})
        assert not report.isError and json.loads(_text(report)) == {}
    created = await _events(home, "task-created")
    assert [(e.key, e.origin, e.data["title"]) for e in created] == [
        ("t-1", "agent:ada", "tidy notes")]
    shown = json.loads(upulse("tasks", "--home", home, "--json").stdout)
    assert "t-1" in json.dumps(shown)


async def test_each_tool_says_whether_it_only_reads(upulse: Upulse, tmp_path: Path) -> None:
    home = _home(upulse, tmp_path)
    async with stdio_session(upulse, home) as session:
        tools = {t.name: t.annotations for t in (await session.list_tools()).tools}
    reading = {name for name, notes in tools.items() if notes and notes.readOnlyHint}
    assert reading == {"recall", "task_state", "maintenance_report", "list_notices"}
    assert all(notes and notes.destructiveHint is False and notes.openWorldHint is False
               for notes in tools.values())
    assert tools["ack_notice"] and tools["ack_notice"].idempotentHint is True
    assert tools["remember"] and tools["remember"].idempotentHint is False
