"""Transcript ingest over Hermes' own session store (hermes_state.SessionDB at
HERMES_HOME/state.db): a message the log cannot store is recorded once and passed over, the
messages around it stored; bytes that are not UTF-8 are read; content stored as JSON parts
is remembered as its text; two followers racing on one home record each message once."""

from __future__ import annotations

import asyncio
import importlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pulse_adapters.hermes import TranscriptIngest
from pulse_core import Engine, EventStore
from pulse_core.store import reveal


@pytest.fixture
def hermes_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hermes"
    home.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(home))
    return home


def hermes_store(hermes_home: Path) -> Any:
    """Hermes' own session store at HERMES_HOME/state.db."""
    state: Any = importlib.import_module("hermes_state")
    return state.SessionDB(hermes_home / "state.db")


async def said_to(engine: Engine, identity: str = "owner") -> list[tuple[str, str]]:
    return [(e.data["role"], reveal(e.data["text"], engine.events.keys))
            for e in await engine.events.read(key=f"identity:{identity}")]


async def ingest_all(ingest: TranscriptIngest, events: EventStore) -> None:
    while await ingest.step(events):
        pass


async def test_a_message_the_log_cannot_store_is_recorded_once_and_the_others_stored(
        hermes_home: Path, tmp_path: Path) -> None:
    db = hermes_store(hermes_home)
    db.create_session("s-1", "cli")
    db.append_message("s-1", "user", "before")
    # content in parts: SessionDB stores it as JSON, the half of an emoji escaped as \ud83d
    half = db.append_message("s-1", "user", [{"type": "text", "text": "half an emoji \ud83d"}])
    db.append_message("s-1", "assistant", "after")
    db.create_session("s-2", "telegram", user_id="12\x0034")  # a NUL: no key can hold it
    nul = db.append_message("s-2", "user", "hi from telegram")
    db.append_message("s-1", "user", "later")
    async with Engine(tmp_path / "pulse") as engine:
        await ingest_all(TranscriptIngest(hermes_home, identity="owner", batch=3),
                         engine.events)
        db.append_message("s-1", "assistant", "last")
        await ingest_all(TranscriptIngest(hermes_home, identity="owner"), engine.events)
        said = await said_to(engine)
        errors = await engine.events.read(key="service:hermes-transcripts")
    db.close()
    assert said == [("human", "before"), ("agent", "after"), ("human", "later"),
                    ("agent", "last")]
    assert [(e.data["session_id"], e.data["message_id"]) for e in errors] == [
        ("s-1", half), ("s-2", nul)]
    assert "surrogate" in errors[0].data["message"] and "NUL" in errors[1].data["message"]
    assert errors[0].data["store"] == str(hermes_home / "state.db")


async def test_bytes_that_are_not_utf8_and_content_in_parts_are_read_as_text(
        hermes_home: Path, tmp_path: Path) -> None:
    db = hermes_store(hermes_home)
    db.create_session("s-1", "cli")
    broken = db.append_message("s-1", "user", "placeholder")
    db.append_message("s-1", "user", [
        {"type": "text", "text": "what is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}])
    db.close()
    with sqlite3.connect(hermes_home / "state.db") as raw:  # a writer that is not Python's
        raw.execute("UPDATE messages SET content = CAST(x'6361666ee9' AS TEXT) WHERE id = ?",
                    (broken,))
    async with Engine(tmp_path / "pulse") as engine:
        await ingest_all(TranscriptIngest(hermes_home, identity="owner"), engine.events)
        said = await said_to(engine)
    assert said == [("human", "cafn\ufffd"), ("human", "what is in this picture?")]


class BothRead:
    """An EventStore whose appends wait until `readers` of them are about to happen: two
    followers that both read the cursor before either writes."""

    def __init__(self, events: EventStore, readers: int) -> None:
        self.events = events
        self.readers = readers
        self.waiting = 0
        self.all_read = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.events, name)

    async def append(self, drafts: Any, **kwargs: Any) -> Any:
        self.waiting += 1
        if self.waiting >= self.readers:
            self.all_read.set()
        await self.all_read.wait()
        return await self.events.append(drafts, **kwargs)


async def test_two_followers_racing_on_one_home_record_each_message_once(
        hermes_home: Path, tmp_path: Path) -> None:
    db = hermes_store(hermes_home)
    db.create_session("s-1", "cli")
    db.append_message("s-1", "user", "first")
    async with Engine(tmp_path / "pulse") as engine:
        first = TranscriptIngest(hermes_home, identity="owner")
        assert await first.step(engine.events) == 1  # the session is ingest's from here on
        db.append_message("s-1", "assistant", "second")
        db.append_message("s-1", "user", "third")
        second = TranscriptIngest(hermes_home, identity="owner")
        racing: Any = BothRead(engine.events, readers=2)
        async with asyncio.timeout(30):  # bounds a hang only
            outcomes = await asyncio.gather(first.step(racing), second.step(racing),
                                            return_exceptions=True)
        await ingest_all(second, engine.events)
        said = await said_to(engine)
    db.close()
    assert said == [("human", "first"), ("agent", "second"), ("human", "third")]
    assert sorted(type(o).__name__ for o in outcomes) == ["VersionConflict", "int"]
