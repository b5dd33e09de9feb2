"""Faults of the awareness reviewer against a hostile model: every failed cycle is recorded
(and so counts against the daily budget and the backoff), and nothing escapes the executor.

A real engine runs the `awareness` layer; the model is the scripted chat-completions server on
127.0.0.1 (pulse_adapters/llm/stand_in.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pulse_adapters.awareness import AwarenessConfig, AwarenessLedger, Reviewer, build_reviewer
from pulse_adapters.awareness.contract import REPLY_CHARS, VALUE_BYTES, VALUE_DEPTH
from pulse_adapters.llm import ChatClient, Completion
from pulse_adapters.llm.stand_in import ChatServer, InvalidLine, Stream
from pulse_core import Engine, Event, LayerContext, ManualClock, MemoryBoard
from pulse_core.memory import reveal_memory
from tests.adapters.awareness_rig import MINUTE, close_engine, open_engine, reply, settings

DEEP = 1_000


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def deep_text(depth: int) -> str:
    return "[" * depth + "]" * depth


@dataclass
class Home:
    engine: Engine
    clock: ManualClock
    board: MemoryBoard
    reviewer: Reviewer
    service: Any

    async def review(self, minutes: float = 1) -> list[Event]:
        """Advance the clock, tick, run the reviews: the cycle records they wrote."""
        self.clock.advance(int(minutes * MINUTE))
        await self.engine.vitals.record("llm-route", {"ok": True})
        before = await self.engine.events.last_seq()
        await self.engine.tick()
        await self.engine.executor_loop.run_until_idle()
        return await self.engine.events.read(before, kinds=["awareness-cycle"])

    async def escaped(self) -> list[Event]:
        """What an escaped failure leaves: effect-failed and error events."""
        return await self.engine.events.read(kinds=["effect-failed", "error"])

    async def ledger(self) -> Any:
        return (await self.engine.snapshot()).state(AwarenessLedger)


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    """The scripted model, started on 127.0.0.1 with an empty script."""
    with ChatServer() as server:
        yield server


@pytest.fixture
async def home(tmp_path: Path, chat_server: ChatServer) -> AsyncIterator[Home]:
    config = AwarenessConfig(initial_delay_s=30, backoff_base_s=600,
                             calls_per_identity_per_day=48)
    clock = ManualClock()
    reviewer = build_reviewer(settings(chat_server, config), LayerContext(tmp_path / "h", clock))
    engine, service = await open_engine(tmp_path / "h", clock, reviewer)
    board = MemoryBoard(engine.events)
    await board.register("ana", "Ana")
    await board.set_state("ana", "city", "Lisbon", confidence=0.6)
    await board.set_state("ana", "plan", {"stay": "month"}, confidence=0.5)
    await board.exchange("ana", "I think I'll stay in Lisbon for good")
    try:
        yield Home(engine, clock, board, reviewer, service)
    finally:
        await close_engine(engine, service)
        await reviewer.client.aclose()


async def test_a_reply_nested_a_thousand_deep_is_a_recorded_failed_cycle(
    home: Home, chat_server: ChatServer,
) -> None:
    """Fault 15: a reply nested ~1,000 levels deep raised RecursionError out of the reviewer;
    no cycle was recorded, so the calls escaped the daily budget and the backoff."""
    envelope = json.dumps({"meaningful_change": False, "narration": "I", "verbs": []})
    hostile = envelope[:-1] + ', "x": ' + deep_text(DEEP) + "}"
    chat_server.script(Stream(pieces=(hostile,)), Stream(pieces=(deep_text(DEEP),)))
    (cycle,) = await home.review()
    assert cycle.data["outcome"] == "failed" and cycle.data["model_calls"] == 2
    assert "nested deeper" in cycle.data["error"]
    assert await home.escaped() == []
    ledger = await home.ledger()
    state = ledger.identities["ana"]
    assert state.failures == 1 and state.calls == 2 and ledger.calls == 2
    for _ in range(8):  # backing off: 600 s, no call
        assert await home.review() == []
    assert len(chat_server.chat_bodies()) == 2


async def test_a_deeply_nested_stream_chunk_is_a_recorded_failed_cycle(
    home: Home, chat_server: ChatServer,
) -> None:
    """Fault 15: a server whose stream chunk itself nests 1,000 deep fails the cycle, recorded."""
    chat_server.script(InvalidLine(line="data: " + deep_text(DEEP), pieces=("{",)))
    (cycle,) = await home.review()
    assert cycle.data["outcome"] == "failed" and cycle.data["model_calls"] == 1
    assert "MalformedStream" in cycle.data["error"]
    assert await home.escaped() == []
    assert (await home.ledger()).identities["ana"].failures == 1


async def test_a_huge_reply_is_cut_and_recorded_as_a_failed_cycle(
    home: Home, chat_server: ChatServer,
) -> None:
    """Fault 15: a reply far past any envelope is cut while streaming and recorded as failed."""
    piece = "I" * (REPLY_CHARS // 2)
    chat_server.script(Stream(pieces=(piece,) * 20, delay_s=0.02))
    (cycle,) = await home.review()
    assert cycle.data["outcome"] == "failed" and cycle.data["model_calls"] == 1
    assert "OutputTooLarge" in cycle.data["error"]
    assert chat_server.disconnected.wait(5)  # the stream was closed, not read to its end
    assert await home.escaped() == []
    assert (await home.ledger()).calls == 1


async def test_a_revise_value_too_deep_or_too_big_is_refused_and_the_rest_settles(
    home: Home, chat_server: ChatServer,
) -> None:
    """Fault 15: a revise_value value is bounded in depth and size; the gate refuses it."""
    too_deep = {"stay": nested(VALUE_DEPTH)}
    too_big = {"stay": "y" * VALUE_BYTES}
    chat_server.script(reply(change=True, narration="I noticed", verbs=[
        {"verb": "revise_value", "target": "state:plan", "value": too_deep},
        {"verb": "revise_value", "target": "state:plan", "value": too_big},
        {"verb": "revise_value", "target": "state:plan", "value": {"stay": "year"}}]))
    (cycle,) = await home.review()
    assert cycle.data["outcome"] == "reviewed"
    reasons = [r["reason"] for r in cycle.data["rejected"]]
    assert len(reasons) == 2
    assert "nested deeper" in reasons[0] and "larger than" in reasons[1]
    assert [a["target"] for a in cycle.data["accepted"]] == ["state:plan"]
    memory = reveal_memory((await home.engine.snapshot()).projection("memory")["ana"],
                           home.engine.events.keys)
    assert memory.state["plan"].value == {"stay": "year"}


class BrokenClient(ChatClient):
    """A client whose transport fails in a way no LlmError names."""

    async def complete(self, messages: Sequence[Mapping[str, Any]], *,
                       response_format: Mapping[str, Any] | None = None,
                       max_tokens: int | None = None, temperature: float | None = None,
                       cancel: Any = None, max_chars: int | None = None) -> Completion:
        raise RuntimeError("the transport broke in an unforeseen way")


async def test_an_unexpected_error_in_a_cycle_is_recorded_not_escaped(
    home: Home, chat_server: ChatServer,
) -> None:
    """Fault 15: any failure inside a cycle, even one nothing names, records a failed cycle."""
    broken = BrokenClient(chat_server.base_url, "stand-in")
    home.reviewer.executor.client = broken
    try:
        (cycle,) = await home.review()
    finally:
        await broken.aclose()
    assert cycle.data["outcome"] == "failed" and cycle.data["model_calls"] == 1
    assert "RuntimeError: the transport broke" in cycle.data["error"]
    assert await home.escaped() == []
    assert (await home.ledger()).identities["ana"].failures == 1


async def test_four_refused_proposals_do_not_block_a_valid_fifth(
    home: Home, chat_server: ChatServer,
) -> None:
    """Fault 23: the verb budget counted proposals, not accepted verbs: four refused proposals
    blocked a valid fifth."""
    chat_server.script(reply(change=True, narration="I noticed she is staying", verbs=[
        {"verb": "create_goal", "target": "state:goal"},
        {"verb": "adjust_confidence", "target": "state:city", "delta": 0.9},
        {"verb": "retract", "target": "state:ghost"},
        {"verb": "dance", "target": "state:city"},
        {"verb": "adjust_confidence", "target": "state:city", "delta": 0.2}]))
    (cycle,) = await home.review()
    assert cycle.data["outcome"] == "reviewed" and len(cycle.data["rejected"]) == 4
    assert [a["target"] for a in cycle.data["accepted"]] == ["state:city"]
    memory = reveal_memory((await home.engine.snapshot()).projection("memory")["ana"],
                           home.engine.events.keys)
    assert memory.state["city"].confidence == pytest.approx(0.8)
