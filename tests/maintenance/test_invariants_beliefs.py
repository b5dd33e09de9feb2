"""Seed 004 invariants 5, 6 and 9: contradictions and merges never destroy what was known."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from pulse_core import Memory, MemoryBoard, Projector, SqliteEventStore, identity_key
from pulse_core._events import EventDraft
from pulse_core.maintenance._beliefs import (
    AssertionMade,
    BeliefBoard,
    Beliefs,
    RevisionRefused,
    classify,
    contested,
)
from pulse_core.maintenance._merge import Merges, canonical, merge_identity

REMOVING = {"record-forgotten", "record-quarantined", "element-purged", "event-quarantined"}


async def test_invariant_05_contradiction_is_not_corruption(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    memory = MemoryBoard(store)
    said = await memory.exchange("ana", "I am in Lisbon time")
    await memory.set_state("ana", "city", "Lisbon")
    before = await store.read()
    board = BeliefBoard(store)
    first = await board.assert_("ana", "timezone", "Europe/Lisbon", origin="human:ana",
                                evidence=(f"ana/{said.data['record']}",))
    second = await board.assert_("ana", "timezone", "America/New_York", confidence=0.4,
                                 mode="inferred", origin="executor:maintenance")
    projector = Projector(store, [Memory(), Beliefs()])
    state = await projector.catch_up()
    assert contested(state["beliefs"]) == [("ana", "timezone")]  # a finding, recorded nowhere
    after = await store.read()
    assert after[:len(before)] == before  # nothing earlier changed
    assert [(e.kind, e.data["record"]) for e in after[len(before):]] == [
        ("assertion-made", first.data["record"]), ("assertion-made", second.data["record"])]
    assert not {e.kind for e in after} & REMOVING  # nothing quarantined, forgotten or purged
    slot = state["beliefs"]["ana"].slots["timezone"]
    assert [(a.value, a.status, a.confidence) for a in slot] == [
        ("Europe/Lisbon", "active", 1.0), ("America/New_York", "active", 0.4)]
    assert state["memory"]["ana"].state["city"].value == "Lisbon"
    assert state["memory"]["ana"].last_human.record == said.data["record"]
    await store.close()


async def test_invariant_06_different_actors_disagreement_is_not_supersession(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = BeliefBoard(store, origin="executor:maintenance")
    human = await board.assert_("ana", "diet", "vegetarian", origin="human:ana")
    await board.assert_("ana", "diet", "vegan", confidence=0.7)
    before = await store.last_seq()
    with pytest.raises(RevisionRefused, match="revises only its own claims"):
        await board.assert_("ana", "diet", "omnivore", supersedes=human.data["record"])
    assert await store.last_seq() == before
    forged = AssertionMade(record="a-forged", slot="diet", value="omnivore",
                           supersedes=human.data["record"])
    await store.append([EventDraft("assertion-made", identity_key("ana"),
                                   msgspec.to_builtins(forged), origin="executor:maintenance")])
    slot = (await Projector(store, [Beliefs()]).catch_up())["beliefs"]["ana"].slots["diet"]
    assert [(a.actor, a.status, a.superseded_by) for a in slot] == [
        ("human:ana", "active", None), ("executor:maintenance", "active", None),
        ("executor:maintenance", "active", None)]
    assert slot[2].supersedes is None and slot[2].ignored_supersedes == human.data["record"]
    assert classify(slot[0], slot[1]) == "different-actors"
    await store.close()


async def test_invariant_09_merge_is_non_destructive(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    memory = MemoryBoard(store)
    await memory.register("ana-old", "Ana (old phone)")
    said = await memory.exchange("ana-old", "call me at the old number")
    await memory.set_state("ana-old", "phone", "+351 000")
    await BeliefBoard(store).assert_("ana-old", "timezone", "Europe/Lisbon")
    await memory.register("ana", "Ana")
    projector = Projector(store, [Memory(), Beliefs(), Merges()])
    old_state = await projector.catch_up()
    before = await store.read()
    old_history = await store.read(key=identity_key("ana-old"))

    await merge_identity(store, "ana-old", "ana", reason="same person, confirmed by Ana",
                         origin="human:ana")
    state = await projector.catch_up()
    after = await store.read()
    assert after[:len(before)] == before
    assert [e.kind for e in after[len(before):]] == ["identity-merged", "identity-absorbed"]
    assert (await store.read(key=identity_key("ana-old")))[:-1] == old_history
    assert state["memory"]["ana-old"].state == old_state["memory"]["ana-old"].state
    assert state["memory"]["ana-old"].last_human.record == said.data["record"]
    assert state["beliefs"]["ana-old"] == old_state["beliefs"]["ana-old"]
    target = canonical(state["merges"], "ana-old")
    assert target == "ana"
    await memory.set_state(target, "phone", "+351 111")  # future writes resolve the target
    state = await projector.catch_up()
    assert state["memory"]["ana"].state["phone"].value == "+351 111"
    assert state["memory"]["ana-old"].state["phone"].value == "+351 000"
    await store.close()
