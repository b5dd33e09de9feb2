"""Writer ranks in the awareness reviewer's gate, and the undo of a whole accepted cycle.

The reviewer is a background writer: it may not change, nor retract, a state item that a
stronger writer (a human, the CLI operator, the agent in a foreground turn) wrote after the
newest human exchange the review is based on. The undo writes compensating events and a
`reviewer_undo` activity in one append guarded by the identity's version.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from pulse_adapters.awareness import AwarenessConfig, Reviewer, build_reviewer
from pulse_adapters.awareness.config import AwarenessConfig as Config
from pulse_adapters.awareness.gate import gate
from pulse_adapters.awareness.undo import (
    CycleNotFound,
    NothingToUndo,
    UndoConflict,
    UndoRefused,
    undo_cycle,
    undo_id,
)
from pulse_adapters.llm.stand_in import ChatServer
from pulse_core import Engine, Event, EventDraft, LayerContext, ManualClock, MemoryBoard
from pulse_core.maintenance._activities import read_activity
from pulse_core.maintenance._authority import rank
from pulse_core.memory import (
    Exchange,
    IdentityMemory,
    StateItem,
    StateRevised,
    StateSet,
    Unresolved,
    identity_key,
    reveal_memory,
)
from tests.adapters.awareness_rig import MINUTE, close_engine, open_engine, reply, settings

SECOND = 1_000


@dataclass
class Rig:
    engine: Engine
    clock: ManualClock
    board: MemoryBoard
    server: ChatServer
    reviewer: Reviewer

    async def review(self, *verbs: dict[str, Any]) -> Event:
        """Script one reply proposing `verbs`, let a minute pass, run the review; its cycle."""
        self.server.script(reply(change=True, narration="I reviewed Ana", verbs=list(verbs)))
        await self.engine.vitals.record("llm-route", {"ok": True})
        self.clock.advance(MINUTE)
        before = await self.engine.events.last_seq()
        await self.engine.tick()
        await self.engine.executor_loop.run_until_idle()
        (cycle,) = await self.engine.events.read(before, kinds=["awareness-cycle"])
        return cycle

    async def memory(self) -> IdentityMemory:
        mem: IdentityMemory = (await self.engine.snapshot()).projection("memory")["ana"]
        return reveal_memory(mem, self.engine.events.keys)

    async def human_set(self, item: str, value: Any, origin: str = "human:web") -> Event:
        return await self.board.write("ana", "state-set", StateSet(record=item, value=value),
                                      origin=origin)


@pytest.fixture
async def make_rig(tmp_path: Path, chat_server: ChatServer
                   ) -> AsyncIterator[Callable[..., Any]]:
    made: list[tuple[Engine, asyncio.Future[list[None]], Reviewer]] = []

    async def make() -> Rig:
        clock = ManualClock()
        home = tmp_path / "home"
        reviewer = build_reviewer(settings(chat_server, AwarenessConfig(initial_delay_s=30)),
                                  LayerContext(home, clock))
        engine, service = await open_engine(home, clock, reviewer)
        made.append((engine, service, reviewer))
        return Rig(engine, clock, MemoryBoard(engine.events), chat_server, reviewer)

    yield make
    for engine, service, reviewer in made:
        await close_engine(engine, service)
        await reviewer.client.aclose()


async def seed(rig: Rig) -> None:
    """Ana, her city set by the agent, then (a second later) a human exchange about it."""
    await rig.board.register("ana", "Ana")
    await rig.board.set_state("ana", "city", "Lisbon", confidence=0.6)
    rig.clock.advance(SECOND)
    await rig.board.exchange("ana", "I moved to Porto last week")


# -- writer ranks ----------------------------------------------------------------------------


async def test_a_value_a_human_set_after_the_exchange_is_not_revised(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    await seed(rig)
    rig.clock.advance(SECOND)
    await rig.human_set("city", "Faro")
    cycle = await rig.review(
        {"verb": "revise_value", "target": "state:city", "value": "Porto"},
        {"verb": "adjust_confidence", "target": "state:city", "delta": -0.1})
    assert cycle.data["outcome"] == "reviewed" and cycle.data["accepted"] == []
    reasons = [r["reason"] for r in cycle.data["rejected"]]
    assert len(reasons) == 2
    for reason in reasons:
        assert reason.startswith("state:city was set by human:web at ")
        assert "after the newest exchange reviewed" in reason
        assert "a stronger writer's word stands" in reason
    city = (await rig.memory()).state["city"]
    assert (city.value, city.confidence, city.by) == ("Faro", 1.0, "human:web")


async def test_a_human_value_is_not_retracted_either(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    await seed(rig)
    rig.clock.advance(SECOND)
    await rig.human_set("city", "Faro", origin="cli")
    cycle = await rig.review({"verb": "retract", "target": "state:city"})
    assert cycle.data["accepted"] == []
    assert "state:city was set by cli" in cycle.data["rejected"][0]["reason"]
    assert "city" in (await rig.memory()).state


async def test_an_agent_value_older_than_a_newer_human_exchange_can_be_revised(
    make_rig: Any,
) -> None:
    rig: Rig = await make_rig()
    await seed(rig)  # agent's Lisbon, then the human's exchange a second later
    cycle = await rig.review({"verb": "revise_value", "target": "state:city", "value": "Porto"})
    assert [v["target"] for v in cycle.data["accepted"]] == ["state:city"]
    city = (await rig.memory()).state["city"]
    assert (city.value, city.by) == ("Porto", "executor:awareness")


async def test_an_agent_value_written_after_the_exchange_stands(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    await seed(rig)
    rig.clock.advance(SECOND)
    await rig.board.set_state("ana", "city", "Braga")  # the agent, in a foreground turn
    cycle = await rig.review({"verb": "revise_value", "target": "state:city", "value": "Porto"})
    assert cycle.data["accepted"] == []
    assert "state:city was set by agent" in cycle.data["rejected"][0]["reason"]
    assert (await rig.memory()).state["city"].value == "Braga"


async def test_the_reviewers_own_earlier_write_can_be_revised(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    await seed(rig)
    rig.clock.advance(SECOND)  # the reviewer's own write, newer than the exchange
    await rig.board.write("ana", "state-revised", StateRevised(record="city", confidence=0.9),
                          origin="executor:awareness")
    cycle = await rig.review({"verb": "adjust_confidence", "target": "state:city",
                              "delta": -0.2})
    assert [v["target"] for v in cycle.data["accepted"]] == ["state:city"]
    assert (await rig.memory()).state["city"].confidence == pytest.approx(0.7)


def _memory(by: str, updated_at: int, exchange_at: int = 5_000) -> IdentityMemory:
    return IdentityMemory(
        "ana", exchanges=(Exchange("x-1", "hi", "human", exchange_at, 1),),
        state={"city": StateItem("city", "Lisbon", 0.5, False, (), updated_at, by)},
        unresolved={"u-1": Unresolved("u-1", "the move", 1, 0)})


@pytest.mark.parametrize(("by", "updated_at", "stands"), [
    ("human", 6_000, True), ("human:web", 6_000, True), ("cli", 6_000, True),
    ("agent", 6_000, True), ("agent:chat", 6_000, True),
    ("human", 4_000, False), ("agent", 4_000, False), ("human", 5_000, False),
    ("executor:awareness", 6_000, False), ("executor:maintenance", 6_000, False),
    ("rule:x", 6_000, False), ("", 6_000, False),
])
def test_the_gate_ranks_the_last_writer_against_the_newest_exchange_reviewed(
    by: str, updated_at: int, stands: bool,
) -> None:
    mem = _memory(by, updated_at)
    allow = frozenset({"state:city", "unresolved:u-1"})
    proposals = [{"verb": "revise_value", "target": "state:city", "value": "Porto"}]
    result = gate(proposals, allow, mem, Config(), writer="executor:awareness",
                  reviewed_at=5_000)
    assert (result.accepted == ()) is stands
    if stands:
        assert result.rejected[0].reason.startswith(f"state:city was set by {by} at ")
    resolve = gate([{"verb": "resolve", "target": "unresolved:u-1"}], allow, mem, Config(),
                   writer="executor:awareness", reviewed_at=5_000)
    assert len(resolve.accepted) == 1  # unresolved items carry no writer: resolve as before


def test_the_basis_is_the_exchange_the_review_saw_not_a_newer_one() -> None:
    # the human set the city at 6 s, after the exchange reviewed (5 s); a newer exchange
    # (7 s) arrived during the review: the model never saw it, so the human's word stands
    mem = _memory("human", 6_000)
    mem = IdentityMemory("ana", exchanges=(*mem.exchanges,
                                           Exchange("x-2", "and?", "human", 7_000, 3)),
                         state=mem.state)
    proposals = [{"verb": "revise_value", "target": "state:city", "value": "Porto"}]
    allow = frozenset({"state:city"})
    assert gate(proposals, allow, mem, Config(), reviewed_at=5_000).accepted == ()
    assert len(gate(proposals, allow, mem, Config(), reviewed_at=7_000).accepted) == 1
    # without an explicit basis the gate takes the newest human exchange it is given
    assert len(gate(proposals, allow, mem, Config()).accepted) == 1


# -- undo ------------------------------------------------------------------------------------


async def _reviewed(rig: Rig) -> tuple[Event, str]:
    """A cycle that revised the city, adjusted the mood and retracted the hobby and resolved
    the open question; the unresolved item's record id."""
    await seed(rig)
    await rig.board.set_state("ana", "mood", "calm", confidence=0.5)
    await rig.board.set_state("ana", "hobby", "chess", confidence=0.4, immutable=("x",))
    opened = await rig.board.open_unresolved("ana", "ask about the move", priority=3)
    rig.clock.advance(SECOND)
    await rig.board.exchange("ana", "I moved, and I'm fine")
    cycle = await rig.review(
        {"verb": "revise_value", "target": "state:city", "value": "Porto"},
        {"verb": "adjust_confidence", "target": "state:mood", "delta": 0.2},
        {"verb": "retract", "target": "state:hobby"},
        {"verb": "resolve", "target": f"unresolved:{opened.data['record']}"})
    assert len(cycle.data["accepted"]) == 4, cycle.data["rejected"]
    return cycle, str(opened.data["record"])


async def test_undo_restores_every_item_a_cycle_changed_in_one_append(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    cycle, question = await _reviewed(rig)
    before = await rig.memory()
    assert before.state["city"].value == "Porto" and "hobby" not in before.state
    event = await undo_cycle(rig.engine.events, "ana", cycle.seq, origin="human:ana",
                             reason="the reviewer misread me")
    after = await rig.memory()
    city, mood, hobby = (after.state[k] for k in ("city", "mood", "hobby"))
    assert (city.value, city.confidence) == ("Lisbon", 0.6)
    assert (mood.value, mood.confidence) == ("calm", 0.5)
    assert (hobby.value, hobby.confidence, hobby.immutable) == ("chess", 0.4, ("x",))
    assert after.unresolved[question].text == "ask about the move"
    assert after.unresolved[question].priority == 3
    written = await rig.engine.events.read(event.seq - 5, limit=5)
    assert len({e.tx for e in written}) == 1 and written[-1].seq == event.seq
    assert sorted(e.kind for e in written[:-1]) == [
        "state-revised", "state-revised", "state-set", "unresolved-opened"]
    assert all(e.origin == "human:ana" for e in written)
    assert all(e.key == identity_key("ana") for e in written[:-1])
    activity = await read_activity(rig.engine.events, undo_id("ana", cycle.seq))
    assert activity is not None and activity.activity_class == "reviewer_undo"
    assert activity.status == "completed" and activity.actors == ("human:ana",)
    verb_seqs = [e.seq for e in await rig.engine.events.read(cycle.seq - 5, limit=5)
                 if e.tx == cycle.tx and e.kind != "awareness-cycle"]
    assert activity.inputs == (f"event:{cycle.seq}", *(f"event:{s}" for s in verb_seqs))
    assert activity.report["reason"] == "the reviewer misread me"
    assert sorted(activity.outputs) == sorted(
        ["ana/city", "ana/mood", "ana/hobby", f"ana/{question}"])


async def test_undo_restores_only_what_the_cycle_changed_of_an_item(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    await seed(rig)
    cycle = await rig.review({"verb": "adjust_confidence", "target": "state:city",
                              "delta": 0.2})
    event = await undo_cycle(rig.engine.events, "ana", cycle.seq, origin="cli", reason="")
    (revised,) = [e for e in await rig.engine.events.read(event.seq - 2, limit=2)
                  if e.kind == "state-revised"]
    assert revised.data["confidence"] == 0.6 and "value_changed" not in revised.data
    assert (await rig.memory()).state["city"].confidence == 0.6


async def test_undoing_twice_returns_the_first_undo_and_writes_nothing(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    cycle, _ = await _reviewed(rig)
    first = await undo_cycle(rig.engine.events, "ana", cycle.id, origin="human", reason="no")
    head = await rig.engine.events.last_seq()
    again = await undo_cycle(rig.engine.events, "ana", cycle.seq, origin="human", reason="no")
    assert again.seq == first.seq and await rig.engine.events.last_seq() == head


async def test_two_concurrent_undos_write_one(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    cycle, _ = await _reviewed(rig)
    head = await rig.engine.events.last_seq()
    one, two = await asyncio.gather(
        undo_cycle(rig.engine.events, "ana", cycle.seq, origin="human", reason="a"),
        undo_cycle(rig.engine.events, "ana", cycle.seq, origin="human", reason="b"))
    assert one.seq == two.seq
    assert await rig.engine.events.last_seq() == head + 5


async def test_undo_refuses_a_missing_or_foreign_cycle(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    cycle, _ = await _reviewed(rig)
    head = await rig.engine.events.last_seq()
    for missing in (head + 10, "0190a4c5-0000-7000-8000-000000000000", cycle.seq - 1):
        with pytest.raises(CycleNotFound, match="no awareness-cycle"):
            await undo_cycle(rig.engine.events, "ana", missing, origin="human", reason="")
    with pytest.raises(CycleNotFound):
        await undo_cycle(rig.engine.events, "bob", cycle.seq, origin="human", reason="")
    assert await rig.engine.events.last_seq() == head


async def test_undo_refuses_a_cycle_that_changed_nothing(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    await seed(rig)
    cycle = await rig.review({"verb": "create_goal", "target": "state:goal"})
    head = await rig.engine.events.last_seq()
    with pytest.raises(NothingToUndo, match=f"cycle #{cycle.seq} .*changed nothing"):
        await undo_cycle(rig.engine.events, "ana", cycle.seq, origin="human", reason="")
    assert await rig.engine.events.last_seq() == head


async def test_undo_refuses_when_an_item_was_written_again_since(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    cycle, _ = await _reviewed(rig)
    rig.clock.advance(SECOND)
    await rig.human_set("city", "Faro", origin="human:ana")
    head = await rig.engine.events.last_seq()
    with pytest.raises(UndoConflict) as refused:
        await undo_cycle(rig.engine.events, "ana", cycle.seq, origin="cli", reason="")
    message = str(refused.value)
    assert "state:city" in message and "human:ana" in message and "nothing was written" in message
    assert isinstance(refused.value, UndoRefused)
    assert await rig.engine.events.last_seq() == head
    assert (await rig.memory()).state["city"].value == "Faro"
    assert await read_activity(rig.engine.events, undo_id("ana", cycle.seq)) is None


async def test_undo_refuses_when_a_resolved_item_was_reopened_or_forgotten(
    make_rig: Any,
) -> None:
    rig: Rig = await make_rig()
    cycle, question = await _reviewed(rig)
    await rig.board.forget("ana", question, reason="not needed")
    with pytest.raises(UndoConflict, match=f"unresolved:{question} .*agent"):
        await undo_cycle(rig.engine.events, "ana", cycle.seq, origin="cli", reason="")


async def test_a_write_between_the_read_and_the_append_is_re_evaluated(
    make_rig: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig: Rig = await make_rig()
    cycle, _ = await _reviewed(rig)
    store = rig.engine.events
    real = store.append
    calls = 0

    async def racing(drafts: Any, expect: Any = None) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:  # someone writes the city just before the undo's append commits
            await real([_human_sets("city", "Faro")])
        return await real(drafts, expect=expect)

    monkeypatch.setattr(store, "append", racing)
    with pytest.raises(UndoConflict, match="state:city"):
        await undo_cycle(store, "ana", cycle.seq, origin="cli", reason="")
    monkeypatch.undo()
    assert (await rig.memory()).state["city"].value == "Faro"
    assert await read_activity(store, undo_id("ana", cycle.seq)) is None
    assert calls == 1  # the retry re-read, re-evaluated and refused: no blind replay


def _human_sets(item: str, value: Any) -> EventDraft:
    return EventDraft("state-set", identity_key("ana"), {"record": item, "value": value},
                      origin="human:bob")


async def test_cycles_can_be_undone_newest_first(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    await seed(rig)
    older = await rig.review({"verb": "revise_value", "target": "state:city", "value": "Porto"})
    rig.clock.advance(SECOND)
    await rig.board.exchange("ana", "well, Braga really")
    newer = await rig.review({"verb": "revise_value", "target": "state:city", "value": "Braga"})
    assert len(newer.data["accepted"]) == 1 and (await rig.memory()).state["city"].value == (
        "Braga")
    with pytest.raises(UndoConflict, match="executor:awareness"):
        await undo_cycle(rig.engine.events, "ana", older.seq, origin="cli", reason="")
    await undo_cycle(rig.engine.events, "ana", newer.seq, origin="cli", reason="")
    assert (await rig.memory()).state["city"].value == "Porto"
    await undo_cycle(rig.engine.events, "ana", older.seq, origin="cli", reason="")
    assert (await rig.memory()).state["city"].value == "Lisbon"


WRITERS = st.sampled_from(["human", "human:web", "cli", "agent", "agent:chat",
                           "executor:awareness", "executor:maintenance", "rule:x", ""])


@examples(max_examples=200, deadline=None)
@given(by=WRITERS, updated_at=st.integers(0, 10), reviewed_at=st.integers(0, 10),
       verb=st.sampled_from(["adjust_confidence", "revise_value", "retract"]))
def test_the_gate_never_lets_the_reviewer_overwrite_a_stronger_newer_word(
    by: str, updated_at: int, reviewed_at: int, verb: str,
) -> None:
    mem = _memory(by, updated_at, exchange_at=reviewed_at)
    proposal = {"verb": verb, "target": "state:city", "delta": 0.1, "value": "Porto"}
    result = gate([proposal], frozenset({"state:city"}), mem, Config(), reviewed_at=reviewed_at)
    stands = rank(by) > rank("executor:awareness") and updated_at > reviewed_at
    assert (result.accepted == ()) is stands
