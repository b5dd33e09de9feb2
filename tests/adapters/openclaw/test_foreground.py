"""OpenClaw's turns hold the foreground: a user message seen in a session's transcript begins
a hold, the agent's answer ends it, and the awareness layer of the engine follows them (a real
transcript store in SQLite, a real engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pulse_adapters.awareness import AwarenessConfig, build_reviewer, foreground_of
from pulse_adapters.llm.stand_in import ChatServer
from pulse_adapters.openclaw import TranscriptIngest, TranscriptSettings
from pulse_core import Engine, Event, LayerContext, StoreUnavailable, SystemClock
from tests.adapters.awareness_rig import settings
from tests.adapters.openclaw.test_hostile import add, agent_store, said
from tests.timing import eventually
from tests.write_lock import WriteLock

HOLDER = "openclaw:main:a"


def marks(events: list[Event]) -> list[tuple[str, str]]:
    return [(e.kind, e.data["holder"]) for e in events]


async def test_a_new_turn_in_the_transcript_holds_the_foreground_until_the_answer(
        tmp_path: Path, chat_server: ChatServer) -> None:
    store = agent_store(tmp_path / "state")
    add(store, "a", said("a-1", "an old question"))  # the backlog: no turn under way
    home = tmp_path / "pulse"
    reviewer = build_reviewer(settings(chat_server, AwarenessConfig()),
                              LayerContext(home, SystemClock()))
    kinds = ["foreground-began", "foreground-ended"]
    async with Engine(home, layers=[reviewer.layer]) as engine:
        foreground = foreground_of(engine)
        ingest = TranscriptIngest(TranscriptSettings(identity="ana"), store)
        assert await ingest.ingest(engine.events) == 1
        assert await engine.events.read(kinds=kinds) == []

        add(store, "a", said("a-2", "the old answer", role="assistant"),
            said("a-3", "a new question"))
        assert await ingest.ingest(engine.events) == 2
        assert marks(await engine.events.read(kinds=kinds)) == [("foreground-began", HOLDER)]
        await eventually(lambda: foreground.holders == (HOLDER,), what="the turn's hold")

        add(store, "a", said("a-4", "the answer", role="assistant"))
        assert await ingest.ingest(engine.events) == 1
        assert marks(await engine.events.read(kinds=kinds)) == [
            ("foreground-began", HOLDER), ("foreground-ended", HOLDER)]
        await eventually(lambda: foreground.holders == (), what="the end of the hold")
    await reviewer.client.aclose()


async def test_no_hold_when_the_lapse_is_zero(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    add(store, "a", said("a-1", "hello"))
    async with Engine(tmp_path / "pulse") as engine:
        ingest = TranscriptIngest(TranscriptSettings(identity="ana", foreground_lapse_s=0),
                                  store)
        await ingest.ingest(engine.events)
        add(store, "a", said("a-2", "again"))
        assert await ingest.ingest(engine.events) == 1
        assert await engine.events.read(kinds=["foreground-began"]) == []


async def test_an_answer_the_log_refused_once_still_ends_the_hold(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    add(store, "a", said("a-1", "an old question"))  # the backlog: no turn under way
    db = tmp_path / "events.db"
    kinds = ["foreground-began", "foreground-ended"]
    async with Engine(tmp_path / "pulse", store=f"sqlite:///{db}?busy_timeout=0.2") as engine:
        ingest = TranscriptIngest(TranscriptSettings(identity="ana"), store)
        await ingest.ingest(engine.events)
        add(store, "a", said("a-2", "a new question"))
        assert await ingest.ingest(engine.events) == 1
        add(store, "a", said("a-3", "the answer", role="assistant"))
        lock = WriteLock(db)  # another process writes: the answer's append is refused
        try:
            with pytest.raises(StoreUnavailable):
                await ingest.ingest(engine.events)
        finally:
            lock.release()
        assert await ingest.ingest(engine.events) == 1  # the next pass stores it
        assert marks(await engine.events.read(kinds=kinds)) == [
            ("foreground-began", HOLDER), ("foreground-ended", HOLDER)]
