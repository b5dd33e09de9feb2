"""A review yields to the real Hermes' turn: the plugin's pre/post model-call hooks bracket the
turn as foreground work on the shared route, so the review waits while the turn holds it, and
runs once it ends."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pulse_adapters.awareness import AwarenessConfig, build_reviewer, foreground_of
from pulse_adapters.llm.stand_in import ChatServer, Stream
from pulse_core import LayerContext, ManualClock, MemoryBoard
from tests.adapters.awareness_rig import MINUTE, close_engine, open_engine, reply, settings
from tests.adapters.hermes.rig import hermes_rig
from tests.timing import scaled

TEST_TIME_LIMIT_S = 300  # bounds a hang only: one hermes run, bounded by HermesRig.run


async def test_a_review_waits_for_the_real_hermes_turn_then_runs(
        tmp_path: Path, chat_server: ChatServer) -> None:
    rig = hermes_rig(tmp_path, chat_server, plugin=True)
    pulse = tmp_path / "pulse"
    clock = ManualClock()
    with ChatServer() as reviewer_model:
        reviewer = build_reviewer(settings(reviewer_model, AwarenessConfig(initial_delay_s=30)),
                                  LayerContext(pulse, clock))
        engine, services = await open_engine(pulse, clock, reviewer)
        try:
            await engine.vitals.record("llm-route", {"ok": False})  # the shared fallback
            board = MemoryBoard(engine.events)
            await board.register("ana", "Ana")
            await board.exchange("ana", "I moved to Porto")
            clock.advance(MINUTE)
            reviewer_model.script(reply())
            chat_server.script(Stream(("a slow", " answer", " to you"), delay_s=1.0))
            foreground = foreground_of(engine)

            turn = asyncio.create_task(asyncio.to_thread(
                rig.run, "-z", "say hi", "-t", "todo", PULSE_HOME=str(pulse),
                PULSE_HERMES_EMBED="0"))
            async with asyncio.timeout(scaled(120)):  # bounds a hang only
                while not foreground.holders:  # noqa: ASYNC110 - Hermes runs on its own
                    await asyncio.sleep(0.02)
            (holder,) = foreground.holders
            assert holder.startswith("hermes:")
            await engine.tick()  # the review is due: it is asked for while the turn holds
            reviewing = asyncio.create_task(engine.executor_loop.run_until_idle())
            async with asyncio.timeout(scaled(60)):
                while not await engine.events.read(kinds=["effect-executing"]):  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            assert foreground.holders == (holder,), "the turn ended before the review began"
            while foreground.holders:
                assert reviewer_model.chat_bodies() == []  # waiting, not asking
                await asyncio.sleep(0.02)
            done, _ = await turn
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() == "a slow answer to you"
            await reviewing
            (cycle,) = await engine.events.read(kinds=["awareness-cycle"])
            assert cycle.data["outcome"] == "reviewed" and cycle.data["route"] == "fallback"
            assert len(reviewer_model.chat_bodies()) == 1
            marks = await engine.events.read(kinds=["foreground-began", "foreground-ended"])
            assert [(e.kind, e.data["holder"], e.origin) for e in marks] == [
                ("foreground-began", holder, "agent:hermes"),
                ("foreground-ended", holder, "agent:hermes")]
            assert marks[-1].seq < cycle.seq
        finally:
            await close_engine(engine, services)
            await reviewer.client.aclose()
