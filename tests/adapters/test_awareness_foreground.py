"""Foreground work on a shared model route: reviews wait while a holder holds it, then run;
a crashed holder's hold lapses; every begin, end and lapse is an event; another process's
events (a second store on the same home) hold it too. A real engine, a real chat server on
127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulse_adapters.awareness import (
    AwarenessConfig,
    Foreground,
    NoAwarenessLayer,
    build_reviewer,
    foreground_began,
    foreground_ended,
    foreground_of,
)
from pulse_adapters.llm.stand_in import ChatServer
from pulse_core import Engine, Event, LayerContext, ManualClock, MemoryBoard, open_home
from tests.adapters.awareness_rig import MINUTE, close_engine, open_engine, reply, settings
from tests.timing import eventually, scaled


@pytest.fixture
async def engine_of(tmp_path: Path, chat_server: ChatServer
                    ) -> AsyncIterator[Callable[..., Any]]:
    opened: list[tuple[Engine, asyncio.Future[list[None]], Any]] = []

    async def make(**review: Any) -> Engine:
        config = AwarenessConfig(initial_delay_s=30, **review)
        clock = ManualClock()
        reviewer = build_reviewer(settings(chat_server, config), LayerContext(tmp_path, clock))
        engine, service = await open_engine(tmp_path / "home", clock, reviewer)
        opened.append((engine, service, reviewer))
        board = MemoryBoard(engine.events)
        await board.register("ana", "Ana")
        await board.exchange("ana", "I moved to Porto")
        clock.advance(MINUTE)
        return engine

    yield make
    for engine, service, reviewer in opened:
        await close_engine(engine, service)
        await reviewer.client.aclose()


async def review_started(engine: Engine) -> asyncio.Task[Any]:
    """Tick once (the review is due) and run the executor in the background."""
    await engine.tick()
    assert await engine.events.read(kinds=["effect"])
    return asyncio.create_task(engine.executor_loop.run_until_idle())


async def cycles(engine: Engine) -> list[Event]:
    return await engine.events.read(kinds=["awareness-cycle"])


async def test_a_review_waits_while_a_turn_holds_the_foreground_then_runs(
        engine_of: Any, chat_server: ChatServer) -> None:
    engine: Engine = await engine_of()
    await engine.vitals.record("llm-route", {"ok": False})  # the shared fallback route
    chat_server.script(reply())
    foreground = foreground_of(engine)
    foreground.begin("turn-1")
    running = await review_started(engine)
    async with asyncio.timeout(scaled(10)):  # bounds a hang only
        while not await engine.events.read(kinds=["effect-executing"]):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)  # the review had time to ask; it must be waiting instead
    assert not running.done() and chat_server.chat_bodies() == []
    foreground.end("turn-1")
    await running
    (cycle,) = await cycles(engine)
    assert cycle.data["outcome"] == "reviewed" and len(chat_server.chat_bodies()) == 1
    marks = await engine.events.read(kinds=["foreground-began", "foreground-ended"])
    assert [(e.kind, e.key, e.data.get("lapsed"))
            for e in marks] == [("foreground-began", "foreground:turn-1", None),
                                ("foreground-ended", "foreground:turn-1", False)]
    assert marks[-1].seq < cycle.seq


async def test_a_hold_never_ended_lapses_and_the_review_then_runs(
        engine_of: Any, chat_server: ChatServer) -> None:
    engine: Engine = await engine_of()
    await engine.vitals.record("llm-route", {"ok": False})
    chat_server.script(reply())
    foreground_of(engine).begin("crashed-turn", lapse_s=0.5)
    running = await review_started(engine)
    await running
    (cycle,) = await cycles(engine)
    assert cycle.data["outcome"] == "reviewed"
    (ended,) = await engine.events.read(kinds=["foreground-ended"])
    assert ended.data["holder"] == "crashed-turn" and ended.data["lapsed"] is True
    assert ended.seq < cycle.seq
    assert foreground_of(engine).holders == ()


async def test_a_review_that_cannot_wait_any_longer_is_recorded_as_preempted(
        engine_of: Any, chat_server: ChatServer) -> None:
    engine: Engine = await engine_of(foreground_wait_s=0.3)
    await engine.vitals.record("llm-route", {"ok": False})
    foreground_of(engine).begin("long-turn")
    await (await review_started(engine))
    (cycle,) = await cycles(engine)
    assert cycle.data["outcome"] == "preempted" and "long-turn" in cycle.data["error"]
    assert chat_server.chat_bodies() == []


@pytest.mark.parametrize("shared", [True, False])
async def test_shared_route_decides_whether_a_healthy_route_yields(
        engine_of: Any, chat_server: ChatServer, shared: bool) -> None:
    engine: Engine = await engine_of(shared_route=shared, foreground_wait_s=0.3)
    await engine.vitals.record("llm-route", {"ok": True})
    chat_server.script(reply())
    foreground_of(engine).begin("turn")
    await (await review_started(engine))
    (cycle,) = await cycles(engine)
    assert cycle.data["route"] == "dedicated"
    assert cycle.data["outcome"] == ("preempted" if shared else "reviewed")


async def test_another_processs_events_hold_the_foreground(
        engine_of: Any, tmp_path: Path) -> None:
    engine: Engine = await engine_of()
    foreground = foreground_of(engine)
    other = await open_home(tmp_path / "home")  # as the Hermes plugin in Hermes' process
    try:
        await other.events.append([foreground_began("hermes:s1", 60, origin="agent:hermes")])
        await eventually(lambda: foreground.holders == ("hermes:s1",), what="the hold")
        assert foreground.active.is_set()
        await other.events.append([foreground_ended("hermes:s1", origin="agent:hermes")])
        await eventually(lambda: foreground.holders == (), what="the end of the hold")
        assert not foreground.active.is_set()
    finally:
        await other.close()


async def test_an_engine_without_the_awareness_layer_has_no_foreground(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "home", clock=ManualClock())
    await engine.open()
    try:
        with pytest.raises(NoAwarenessLayer, match=r'add "awareness" to config\.json'):
            foreground_of(engine)
    finally:
        await engine.close()


async def test_a_stop_arriving_as_the_foreground_frees_stops_the_waiting_review() -> None:
    """The engine's stop and a hold's end in the same turn of the loop: the review's wait is
    stopped, not returned from as if free (asyncio.wait_for lost such a stop on Python 3.11)."""
    foreground = Foreground()
    foreground.begin("turn")
    waiting = asyncio.create_task(foreground.wait_free(60))
    await asyncio.sleep(0)
    assert not waiting.done()
    foreground.end("turn")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["a", "b", "c"])), max_size=30))
def test_the_foreground_is_held_exactly_while_some_holder_holds(
        steps: list[tuple[bool, str]]) -> None:
    foreground = Foreground()
    holding: set[str] = set()
    for begins, holder in steps:
        if begins:
            foreground.begin(holder)
            holding.add(holder)
        else:
            foreground.end(holder)
            holding.discard(holder)
        assert foreground.holders == tuple(sorted(holding))
        assert foreground.active.is_set() == bool(holding)
