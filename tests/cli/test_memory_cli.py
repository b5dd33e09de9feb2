"""`upulse memory list|show|exchange`: the agent's memory from the shell, as a real process
on a real home (and, last, the exchange the awareness reviewer then reviews)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any

from pulse_adapters.awareness import AwarenessConfig, build_reviewer
from pulse_adapters.llm.stand_in import ChatServer
from pulse_core import LayerContext, ManualClock, MemoryBoard, SqliteEventStore
from pulse_core.memory import StateRevised
from tests.adapters.awareness_rig import MINUTE, close_engine, open_engine, reply, settings
from tests.cli.runner import Upulse


async def write_memory(home: Path) -> None:
    """What an agent's own code writes about ana: state, a revision, an unresolved item, an
    observation, a fact, a reflection, and a forgotten observation."""
    store = await SqliteEventStore.open(home / "events.db")
    try:
        board = MemoryBoard(store)
        await board.set_state("ana", "city", "Porto", confidence=0.5)
        await MemoryBoard(store, origin="executor:awareness").write(
            "ana", "state-revised", StateRevised(record="city", value="Lisbon",
                                                 value_changed=True, reason="she said so"))
        await board.open_unresolved("ana", "ask how the move went", priority=2)
        await board.observe("ana", "phone", "battery", 81)
        gone = await board.observe("ana", "mic", "transcript", "a stranger's voice")
        await board.fact("ana", "stays with a friend until March")
        await board.reflect("ana", "Ana is settling in")
        await board.quarantine("ana", str(gone.data["record"]), reason="untrusted")
    finally:
        await store.close()


def home_files(home: Path) -> dict[str, str]:
    return {str(p.relative_to(home)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(home.iterdir()) if p.is_file()}


def test_an_exchange_recorded_from_the_shell_is_what_show_shows(upulse: Upulse, tmp_path: Path
                                                                ) -> None:
    home = upulse.init(tmp_path / "home")
    event = upulse.json("memory", "exchange", "ana", "I moved to Lisbon", "--home", home)
    assert isinstance(event, dict)
    assert (event["kind"], event["key"], event["origin"]) == (
        "human-exchange", "identity:ana", "human")
    said = upulse("memory", "exchange", "ana", "Welcome!\x1b[2J", "--role", "agent",
                  "--home", home).stdout
    assert said.startswith("agent exchange x-") and "with ana recorded" in said
    shown = upulse.json("memory", "show", "ana", "--home", home)
    assert isinstance(shown, dict)
    assert [(x["text"], x["role"], x["by"]) for x in shown["exchanges"]] == [
        ("Welcome!\x1b[2J", "agent", "cli"), ("I moved to Lisbon", "human", "human")]
    assert shown["exchanges"][1]["record"] == event["data"]["record"]
    registered: Any = upulse.json("events", "--kind", "identity-registered", "--home", home)
    assert [e["key"] for e in registered] == ["identity:ana"]
    text = upulse("memory", "show", "ana", "--home", home).stdout
    assert "I moved to Lisbon" in text and "Welcome!\\x1b[2J" in text and "\x1b" not in text
    assert "exchanges, newest first:" in text and "state: none" in text


async def test_show_lists_every_record_type_with_who_wrote_it(upulse: Upulse, tmp_path: Path
                                                              ) -> None:
    home = upulse.init(tmp_path / "home")
    await write_memory(home)
    shown = upulse.json("memory", "show", "ana", "--home", home)
    assert isinstance(shown, dict)
    (city,) = shown["state"]
    assert (city["value"], city["set_by"], city["revised_by"], city["revision_reason"]) == (
        "Lisbon", "agent", "executor:awareness", "she said so")
    assert [u["text"] for u in shown["unresolved"]] == ["ask how the move went"]
    assert [o["value"] for o in shown["observations"]] == [81]
    assert [f["text"] for f in shown["facts"]] == ["stays with a friend until March"]
    assert shown["reflection"]["text"] == "Ana is settling in"
    assert [(r["was"], r["how"], r["reason"]) for r in shown["removed"]] == [
        ("observation", "quarantined", "untrusted")]
    text = upulse("memory", "show", "ana", "--home", home).stdout
    for line in ("city", "\"Lisbon\"", "executor:awareness", "(she said so)",
                 "ask how the move went", "battery", "stays with a friend until March",
                 "Ana is settling in", "quarantined", "untrusted"):
        assert line in text, line
    assert "stranger" not in text


async def test_list_counts_each_identitys_records_and_names_its_last_exchange(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    assert upulse.json("memory", "list", "--home", home) == []
    assert "no identities" in upulse("memory", "list", "--home", home).stdout
    await write_memory(home)
    upulse("memory", "exchange", "ana", "I moved to Lisbon", "--home", home)
    upulse("memory", "exchange", "bob", "hello", "--home", home)
    upulse("memory", "exchange", "bob", "still there?", "--home", home)
    listed = upulse.json("memory", "list", "--home", home)
    assert isinstance(listed, list)
    by_id = {s["identity"]: s for s in listed}
    assert list(by_id) == ["ana", "bob"]
    assert by_id["ana"]["counts"] == {"exchanges": 1, "state": 1, "unresolved": 1,
                                      "observations": 1, "facts": 1, "reflections": 1,
                                      "removed": 1}
    assert by_id["bob"]["counts"]["exchanges"] == 2
    assert by_id["bob"]["last_exchange"]["text"] == "still there?"
    table = upulse("memory", "list", "--home", home).stdout.splitlines()
    assert table[0].split()[:3] == ["IDENTITY", "NAME", "EXCH"]
    assert table[2].split()[:3] == ["bob", "-", "2"] and "human: still there?" in table[2]


def test_show_of_an_unknown_identity_names_the_nearest_known_one(upulse: Upulse,
                                                                 tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    empty = upulse("memory", "show", "ana", "--home", home, ok=False)
    assert empty.returncode == 1
    assert "no identity 'ana'" in empty.stderr and "upulse memory exchange ana" in empty.stderr
    upulse("memory", "exchange", "ana", "hello", "--home", home)
    typo = upulse("memory", "show", "anna", "--home", home, ok=False)
    assert typo.returncode == 1
    assert "no identity 'anna' in this home's memory — did you mean 'ana'?" in typo.stderr
    far = upulse("memory", "show", "zebulon", "--home", home, "--json", ok=False)
    assert far.returncode == 1 and far.stdout == ""
    assert "`upulse memory list` lists them" in far.stderr


def test_an_empty_exchange_is_refused_and_nothing_is_written(upulse: Upulse, tmp_path: Path
                                                             ) -> None:
    home = upulse.init(tmp_path / "home")
    before = home_files(home)
    for identity, text in (("ana", ""), ("ana", "  \n "), ("", "hello"), ("x" * 600, "hi")):
        refused = upulse("memory", "exchange", identity, text, "--home", home, ok=False)
        assert refused.returncode == 2, (identity[:10], text)
        assert "IDENTITY" in refused.stderr or "TEXT is empty" in refused.stderr
    assert upulse.json("events", "--home", home) == []
    assert upulse.json("memory", "list", "--home", home) == []
    after = home_files(home)
    assert {name: after[name] for name in before} == before


async def test_list_and_show_open_the_home_read_only_and_change_no_file(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    await write_memory(home)
    before = home_files(home)
    upulse("memory", "list", "--home", home)
    upulse("memory", "show", "ana", "--home", home, "--json")
    upulse("memory", "show", "anne", "--home", home, ok=False)
    assert home_files(home) == before


def test_an_exchange_is_recorded_while_the_daemon_runs(upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("daemon", "start", "--home", home)
    upulse("memory", "exchange", "ana", "are you there?", "--home", home)
    shown: Any = upulse.json("memory", "show", "ana", "--home", home)
    assert [x["text"] for x in shown["exchanges"]] == ["are you there?"]
    assert upulse("daemon", "status", "--home", home).returncode == 0


async def test_the_awareness_reviewer_reviews_an_exchange_recorded_from_the_shell(
        upulse: Upulse, tmp_path: Path) -> None:
    home = tmp_path / "home"
    clock = ManualClock(time.time_ns() // 1_000_000)
    with ChatServer() as server:
        reviewer = build_reviewer(settings(server, AwarenessConfig(initial_delay_s=30)),
                                  LayerContext(home, clock))
        engine, service = await open_engine(home, clock, reviewer)
        try:
            event: Any = await asyncio.to_thread(
                upulse.json, "memory", "exchange", "ana", "I think I'll stay in Lisbon",
                "--home", home)
            server.script(reply(narration="I see Ana means to stay in Lisbon"))
            clock.advance(2 * MINUTE)
            await engine.vitals.record("llm-route", {"ok": True})
            await engine.tick()
            await engine.executor_loop.run_until_idle()
            (cycle,) = await engine.events.read(kinds=["awareness-cycle"])
        finally:
            await close_engine(engine, service)
            await reviewer.client.aclose()
    assert cycle.key == "identity:ana" and cycle.data["outcome"] == "reviewed", cycle.data
    assert cycle.data["source"] == event["data"]["record"]
    (body,) = server.chat_bodies()
    assert "I think I'll stay in Lisbon" in body["messages"][1]["content"]
