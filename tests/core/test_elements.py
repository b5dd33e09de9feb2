"""Memory elements: every record folded into one maintainable unit, with versions and lineage."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from pulse_core._beliefs import BeliefBoard
from pulse_core._element_kinds import (
    CommitmentMade,
    CommitmentUpdated,
    Consolidated,
    InsightRecorded,
    SalienceSet,
    element_id,
)
from pulse_core._element_queries import dependents, eligible_for_decay, of_identity, references_of
from pulse_core._elements import ElementsReader, MemoryElements
from pulse_core._events import EventDraft
from pulse_core._metabolism import DecayPolicy, sweep
from pulse_core._projector import Projector
from pulse_core.memory import MemoryBoard, identity_key
from pulse_core.store import SqliteEventStore
from pulse_core.store._base import EventStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EventStore]:
    opened = await SqliteEventStore.open(tmp_path / "events.db")
    yield opened
    await opened.close()


async def write(store: EventStore, identity: str, kind: str, body: msgspec.Struct,
                origin: str = "agent") -> None:
    await store.append([EventDraft(kind, identity_key(identity), msgspec.to_builtins(body),
                                   origin=origin)])


async def test_every_memory_kind_becomes_an_element_with_its_type_salience_and_writer(
    store: EventStore,
) -> None:
    board = MemoryBoard(store)
    await board.register("ana", "Ana")
    x = await board.exchange("ana", "hi")
    await board.set_state("ana", "city", "Lisbon", protected=True)
    await board.set_state("ana", "mood", "ok")
    u = await board.open_unresolved("ana", "call back", priority=5)
    o = await board.observe("ana", "s", "k", 1, severity="critical", routine=False)
    w = await board.observe("ana", "s", "k", 2, severity="warning", routine=False)
    f = await board.fact("ana", "in May")
    r = await board.reflect("ana", "calm week")
    state = await ElementsReader(store).current()
    got = {e.record: (e.type, e.salience, e.strength) for e in of_identity(state, "ana")}
    rec = {ev.data["record"]: ev for ev in (x, u, o, w, f, r)}
    assert got[x.data["record"]] == ("exchange", 0.0, 1.0)
    assert got["city"] == ("state", 1.0, 1.0) and got["mood"] == ("state", 0.0, 1.0)
    assert got[u.data["record"]] == ("unresolved", 0.8, 1.0)
    assert got[o.data["record"]][:2] == ("observation", 0.9)
    assert got[w.data["record"]][:2] == ("observation", 0.6)
    assert got[f.data["record"]][0] == "fact" and got[r.data["record"]][0] == "reflection"
    assert state.elements[element_id("ana", x.data["record"])].writer == "human"
    assert state.versions["ana"] == await store.head(identity_key("ana")) == 9
    assert len(rec) == 6


async def test_versions_follow_every_event_on_the_identity_key_including_foreign_kinds(
    store: EventStore,
) -> None:
    board = MemoryBoard(store)
    await board.register("ana")
    await BeliefBoard(store).assert_("ana", "city", "Porto")
    reader = ElementsReader(store)
    assert (await reader.current()).versions["ana"] == 2
    await board.set_state("ana", "mood", "ok")
    assert (await reader.current()).versions["ana"] == 3 == await store.head("identity:ana")


async def test_a_forgotten_record_leaves_and_never_comes_back(store: EventStore) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon")
    await board.forget("ana", "city")
    await board.set_state("ana", "city", "Porto")  # a record id once forgotten stays gone
    state = await ElementsReader(store).current()
    assert "ana/city" not in state.elements and "ana/city" in state.forgotten


async def test_revisions_and_retractions_are_marked_not_dropped(store: EventStore) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon")
    await board.set_state("ana", "job", "baker")
    revised = await board.write("ana", "state-revised", {"record": "city", "value": "Porto",
                                                         "value_changed": True})
    gone = await board.write("ana", "state-retracted", {"record": "job"})
    state = await ElementsReader(store).current()
    assert state.elements["ana/city"].revised_seq == revised.seq
    assert not state.elements["ana/city"].retracted
    job = state.elements["ana/job"]
    assert job.retracted and job.revised_seq == gone.seq
    assert [e.id for e in eligible_for_decay(state, cycle_start=10**15, floor=0.05,
                                             protection=0.8)] == ["ana/city"]


async def test_assertions_insights_and_consolidation_link_both_ways(store: EventStore) -> None:
    board = MemoryBoard(store)
    o = (await board.observe("ana", "s", "k", 1)).data["record"]
    made = await BeliefBoard(store).assert_("ana", "city", "Porto", evidence=(f"ana/{o}",))
    a = made.data["record"]
    await write(store, "ana", "insight-recorded", InsightRecorded(
        record="i-1", text="Ana moved", derived_from=(f"ana/{a}",), activity="act-1"))
    await write(store, "ana", "insight-recorded", InsightRecorded(
        record="i-2", text="so she needs a doctor", derived_from=("i-1",), activity="act-2"))
    await write(store, "ana", "element-consolidated", Consolidated(records=(o,), to="i-1"))
    state = await ElementsReader(store).current()
    assertion = state.elements[f"ana/{a}"]
    assert assertion.type == "assertion" and assertion.references == (f"ana/{o}",)
    assert references_of(state, f"ana/{o}") == (f"ana/{a}",)
    insight = state.elements["ana/i-1"]
    assert insight.type == "insight" and insight.strength == 0.7 and insight.salience == 0.5
    assert state.elements[f"ana/{o}"].consolidated_to == ("ana/i-1",)
    assert dependents(state, f"ana/{a}") == ["ana/i-1", "ana/i-2"]
    assert dependents(state, f"ana/{a}", depth=1) == ["ana/i-1"]
    assert dependents(state, f"ana/{a}", limit=1) == ["ana/i-1"]


async def test_a_pending_high_impact_commitment_is_not_eligible_for_decay_until_it_ends(
    store: EventStore,
) -> None:
    await write(store, "ana", "commitment-made", CommitmentMade(
        record="c-1", text="renew the passport", due_at=5, impact="high"))
    reader = ElementsReader(store)
    state = await reader.current()
    commitment = state.elements["ana/c-1"]
    assert commitment.type == "commitment" and commitment.commitment is not None
    assert commitment.commitment.status == "pending" and commitment.salience == 0.9
    await write(store, "ana", "salience-set",  # salience alone does not free it
                SalienceSet(record="c-1", salience=0.0))
    assert eligible_for_decay(await reader.current(), cycle_start=10, floor=0.05,
                              protection=0.8) == []
    await write(store, "ana", "commitment-updated",
                CommitmentUpdated(record="c-1", status="fulfilled"))
    assert [e.id for e in eligible_for_decay(await reader.current(), cycle_start=10,
                                             floor=0.05, protection=0.8)] == ["ana/c-1"]


async def test_the_reader_folds_only_what_is_new_and_agrees_with_the_projector(
    store: EventStore,
) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon")
    reader = ElementsReader(store)
    await reader.current()
    first = reader.cursor
    await board.set_state("bo", "city", "Porto")
    state = await reader.current()
    assert reader.cursor > first and set(state.elements) == {"ana/city", "bo/city"}
    projected = (await Projector(store, [MemoryElements()]).catch_up())["elements"]
    assert dict(projected.elements.items()) == dict(state.elements.items())
    assert dict(projected.versions.items()) == dict(state.versions.items())


async def test_a_sweep_event_rebinding_many_elements_at_once_folds_like_one_by_one(
    store: EventStore,
) -> None:
    board = MemoryBoard(store)
    for i in range(40):  # one event per identity: 40 records rebound by a single event
        await board.set_state("ana", f"s{i}", i)
    await board.set_state("bo", "city", "Porto")
    reader = ElementsReader(store)
    before = await reader.current()
    await sweep(store, reader, cycle_start=7, policy=DecayPolicy(factor=0.5, limit=100))
    after = await reader.current()
    assert len(after.elements) == len(before.elements) == 41
    assert {e.strength for e in after.elements.values()} == {0.5}
    assert {e.last_metabolized_at for e in after.elements.values()} == {7}
    assert after.elements.changed_keys(before.elements) == set(before.elements)
    rebuilt = dict(after.elements.items())
    assert all(after.elements[k] == v for k, v in rebuilt.items())


async def test_dependents_of_a_forgotten_root_are_still_found_and_citations_cross_identities(
    store: EventStore,
) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon")
    await write(store, "ana", "insight-recorded", InsightRecorded(
        record="i-1", text="by the sea", derived_from=("city",), activity="a"))
    seen = (await board.observe("ana", "gps", "city", "Porto")).data["record"]
    made = await BeliefBoard(store).assert_("bo", "friend_city", "Porto",
                                            evidence=(f"ana/{seen}",))
    reader = ElementsReader(store)
    assert references_of(await reader.current(), f"ana/{seen}") == (
        f"bo/{made.data['record']}",)
    await board.forget("ana", "city")
    state = await reader.current()
    assert dependents(state, "ana/city") == ["ana/i-1"]  # a ghost's derivations are found
    assert state.elements["ana/i-1"].derived_from == ("ana/city",)


async def test_a_kept_reader_folds_only_what_is_new_and_agrees_with_a_fresh_fold(
        store: EventStore) -> None:
    board = MemoryBoard(store)
    for n in range(7):
        await board.exchange("ana", f"hello {n}")
    kept = ElementsReader(store, page=3)
    first = await kept.current()
    assert len(of_identity(first, "ana")) == 7
    await board.exchange("bob", "late")
    await board.set_state("ana", "city", "Porto")
    again = await kept.current()
    fresh = await ElementsReader(store).current()
    assert again.elements == fresh.elements and again.versions == fresh.versions
    assert kept.cursor == await store.last_seq()
    assert of_identity(again, "bob") and len(of_identity(again, "ana")) == 8
