"""Memory elements: every record folded into one maintainable unit, with versions and lineage."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_core._events import EventDraft
from pulse_core._projector import Projector
from pulse_core.maintenance import ElementsReader, MemoryElements
from pulse_core.maintenance._beliefs import BeliefBoard
from pulse_core.maintenance._element_kinds import (
    CommitmentMade,
    CommitmentUpdated,
    Consolidated,
    InsightRecorded,
    SalienceSet,
    element_id,
)
from pulse_core.maintenance._element_queries import (
    dependents,
    eligible_for_decay,
    of_identity,
    references_of,
)
from pulse_core.maintenance._metabolism import DecayPolicy, sweep
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


async def test_a_reader_takes_what_it_just_appended_only_when_nothing_came_between(
        store: EventStore) -> None:
    """The events an append returned are folded at once when they are the log's next ones
    for the reader; after another writer's event they are left to the next read."""
    board = MemoryBoard(store)
    record = (await board.exchange("ana", "hello")).data["record"]
    reader = ElementsReader(store)
    await reader.current()
    drafts = [EventDraft("memory-metabolized", identity_key("ana"),
                         {"cycle_start": 5, "factor": 0.5, "strengths": {record: 0.5}},
                         origin="executor:maintenance")]
    taken = await store.append(drafts)
    folded = await reader.take(taken.events)
    assert reader.cursor == taken.last_seq  # folded without reading it back
    assert folded is not None
    assert folded is await reader.current()  # the state after them, as the next read has it
    assert folded.elements[f"ana/{record}"].strength == 0.5
    await board.exchange("bo", "between")  # another writer comes first
    late = await store.append(drafts)
    assert await reader.take(late.events) is None
    assert reader.cursor < late.last_seq  # left to the next read, which folds both
    assert await reader.current() == await ElementsReader(store).current()
    assert reader.cursor == late.last_seq


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


# -- review findings: the fold enforces the structure, hostile payloads are refused ------


K = "identity:ana"


async def append(store: EventStore, *drafts: tuple[str, dict[str, Any], str]) -> None:
    await store.append([EventDraft(kind, K, data, origin=origin)
                        for kind, data, origin in drafts])


async def test_the_fold_ignores_a_hold_release_by_a_non_human_and_a_purge_of_a_held_element(
    store: EventStore,
) -> None:
    obs = {"source": "s", "key": "x", "value": 1}
    await append(store, ("observation-recorded", {"record": "o-a", **obs}, "human:ana"),
                 ("legal-hold-set", {"record": "o-a"}, "human:ops"),
                 ("element-archived", {"record": "o-a"}, "human:ops"))
    await append(store, ("legal-hold-released", {"record": "o-a"}, "agent"),
                 ("element-purged", {"record": "o-a"}, "agent"))
    state = await ElementsReader(store).current()
    assert "ana/o-a" not in state.purged
    assert state.elements["ana/o-a"].legal_hold
    await append(store, ("legal-hold-released", {"record": "o-a"}, "human:ops"))
    assert not (await ElementsReader(store).current()).elements["ana/o-a"].legal_hold


async def test_the_fold_never_purges_an_active_or_referenced_element(store: EventStore) -> None:
    obs = {"source": "s", "key": "x", "value": 1}
    await append(store, ("observation-recorded", {"record": "o-a", **obs}, "agent"),
                 ("observation-recorded", {"record": "o-b", **obs}, "agent"),
                 ("insight-recorded", {"record": "i-1", "text": "t", "derived_from": ["o-b"],
                                       "activity": "a"}, "agent"),
                 ("element-purged", {"record": "o-a"}, "agent"),
                 ("element-archived", {"record": "o-b"}, "agent"),
                 ("element-purged", {"record": "o-b"}, "agent"))
    state = await ElementsReader(store).current()
    assert {"ana/o-a", "ana/o-b"} <= set(state.elements) and not state.purged


@pytest.mark.parametrize("path,stage", [
    (["element-tombstoned"], "active"),
    (["element-restored"], "active"),
    (["element-archived", "element-archived", "element-restored"], "active"),
    (["element-archived", "element-tombstoned", "element-restored"], "tombstoned"),
    (["element-archived", "element-tombstoned", "element-archived"], "tombstoned"),
])
async def test_the_fold_applies_only_the_ladders_transitions(
    store: EventStore, path: list[str], stage: str,
) -> None:
    await append(store, ("observation-recorded", {"record": "o-a", "source": "s", "key": "x"},
                         "agent"), *((kind, {"record": "o-a"}, "agent") for kind in path))
    assert (await ElementsReader(store).current()).elements["ana/o-a"].stage == stage


async def test_a_forgotten_held_record_is_still_forgotten(store: EventStore) -> None:
    await append(store, ("observation-recorded", {"record": "o-a", "source": "s", "key": "x"},
                         "agent"), ("legal-hold-set", {"record": "o-a"}, "human:ops"),
                 ("record-forgotten", {"record": "o-a"}, "human:ana"))
    assert "ana/o-a" in (await ElementsReader(store).current()).forgotten


async def test_a_reference_written_before_its_target_is_linked_when_the_target_comes(
    store: EventStore,
) -> None:
    await append(store, ("insight-recorded", {"record": "i-1", "text": "t",
                                              "derived_from": ["o-later"], "activity": "a"},
                         "agent"))
    await append(store, ("observation-recorded", {"record": "o-later", "source": "s",
                                                  "key": "x"}, "agent"))
    state = await ElementsReader(store).current()
    assert references_of(state, "ana/o-later") == ("ana/i-1",)
    assert dependents(state, "ana/o-later") == ["ana/i-1"]


@pytest.mark.parametrize("kind,data", [
    ("memory-metabolized", {"cycle_start": 1, "factor": 1.5, "strengths": {}}),
    ("memory-metabolized", {"cycle_start": 1, "factor": 0.0, "strengths": {}}),
    ("memory-metabolized", {"cycle_start": -5, "factor": 0.9, "strengths": {}}),
    ("memory-metabolized", {"cycle_start": 2**63, "factor": 0.9, "strengths": {}}),
    ("insight-recorded", {"record": "i-s", "text": "t", "derived_from": ["i-s"],
                          "activity": ""}),
    ("evidence-corrected", {"record": "x-1", "by": "x-1"}),
    ("element-consolidated", {"records": ["x-1", "x-2"], "to": "x-1"}),
    ("element-archived", {"record": "r" * 201}),
    ("memory-reinforced", {"record": "", "strength": 0.5}),
    ("commitment-made", {"record": "c-1", "text": "t", "due_at": -1}),
    ("derivation-stale", {"record": "i-a", "root": "r" * 513}),
    ("insight-recorded", {"record": "i-2", "text": "t", "derived_from": ["r" * 513],
                          "activity": ""}),
])
async def test_hostile_element_payloads_are_refused_at_append(
    store: EventStore, kind: str, data: dict[str, object],
) -> None:
    from pulse_core._errors import PulseError
    with pytest.raises((PulseError, ValueError)):
        await append(store, (kind, data, "agent"))


async def test_a_far_future_sweep_stamp_never_freezes_an_element(store: EventStore) -> None:
    await append(store, ("observation-recorded", {"record": "o-a", "source": "s", "key": "x"},
                         "agent"),
                 ("memory-metabolized", {"cycle_start": 2**62, "factor": 0.9,
                                         "strengths": {"o-a": 0.5}}, "agent"))
    element = (await ElementsReader(store).current()).elements["ana/o-a"]
    assert element.last_metabolized_at is not None
    assert element.last_metabolized_at <= element.created_at + 60_000
    policy = DecayPolicy()
    assert element in eligible_for_decay(await ElementsReader(store).current(),
                                         cycle_start=element.created_at + 1,
                                         floor=policy.floor, protection=policy.protection)


async def test_the_fold_drops_self_references_and_two_cycles(store: EventStore) -> None:
    await append(store, ("insight-recorded", {"record": "i-a", "text": "t",
                                              "derived_from": ["ana/i-a", "i-b"],
                                              "activity": ""}, "agent"),
                 ("insight-recorded", {"record": "i-b", "text": "t", "derived_from": ["i-a"],
                                       "activity": ""}, "agent"))
    state = await ElementsReader(store).current()
    assert "ana/i-a" not in state.elements["ana/i-a"].references
    assert not ("ana/i-a" in state.elements["ana/i-b"].referenced_by
                and "ana/i-b" in state.elements["ana/i-a"].referenced_by)


# -- the checkpointed reader: a restart folds only the tail ---------------------------------


async def _history(store: EventStore) -> None:
    board = MemoryBoard(store)
    await board.register("ana", "Ana")
    for n in range(5):
        await board.exchange("ana", f"hello {n}")
    await board.set_state("ana", "city", "Lisbon", protected=True)
    await board.open_unresolved("ana", "call back", priority=5)
    await write(store, "ana", "insight-recorded", InsightRecorded(
        record="i-1", text="by the sea", derived_from=("city",), activity="a"))
    await sweep(store, ElementsReader(store), cycle_start=7,
                policy=DecayPolicy(factor=0.5, limit=100))


async def test_a_checkpointed_reader_resumes_from_its_checkpoint_and_folds_only_the_tail(
        store: EventStore, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    await _history(store)
    first = ElementsReader(store, checkpoints=folder)
    await first.current()
    await first.checkpoint()
    saved_at = await store.last_seq()
    board = MemoryBoard(store)
    await board.exchange("bob", "late")
    await board.set_state("ana", "city", "Porto")
    restarted = ElementsReader(store, checkpoints=folder)
    assert restarted.cursor == saved_at  # starts from the checkpoint, not from seq 0
    resumed = await restarted.current()
    fresh = await ElementsReader(store).current()
    assert resumed == fresh  # every field: elements, versions, digests, lineage, strengths
    assert {e.strength for e in of_identity(resumed, "ana") if e.type == "exchange"} == {0.5}
    assert restarted.cursor == await store.last_seq()


async def test_a_checkpoint_of_another_log_is_discarded_and_the_fold_starts_over(
        store: EventStore, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    await _history(store)
    first = ElementsReader(store, checkpoints=folder)
    await first.current()
    await first.checkpoint()
    other = await SqliteEventStore.open(tmp_path / "other.db")
    try:
        for n in range(3):
            await MemoryBoard(other).exchange("zed", f"hi {n}")
        await MemoryBoard(other).exchange("zed", "padding to reach the checkpoint's seq" * 3)
        for n in range(20):
            await MemoryBoard(other).exchange("yan", f"more {n}")
        got = await ElementsReader(other, checkpoints=folder).current()
        assert got == await ElementsReader(other).current()
        assert not of_identity(got, "ana") and len(of_identity(got, "yan")) == 20
    finally:
        await other.close()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1.5, -0.1, "0.5"])
def test_a_sweep_payload_with_a_strength_outside_0_1_is_refused_by_name(bad: Any) -> None:
    from pulse_core.maintenance._element_kinds import Metabolized

    assert Metabolized(1, 0.5, {"x-1": 0.25, "x-2": 1, "x-3": 0.0}).strengths["x-2"] == 1
    with pytest.raises(ValueError, match=r"strength of 'x-9'"):
        Metabolized(1, 0.5, {"x-1": 0.25, "x-9": bad})


OPS = st.lists(st.tuples(st.sampled_from(["exchange", "state", "sweep"]),
                         st.sampled_from(["ana", "bo"]), st.integers(0, 3)),
               min_size=1, max_size=25)


async def apply_op(store: EventStore, op: tuple[str, str, int], n: int) -> None:
    what, who, value = op
    if what == "exchange":
        await MemoryBoard(store).exchange(who, f"m{n}")
    elif what == "state":
        await MemoryBoard(store).set_state(who, f"s{value}", value)
    else:
        await sweep(store, ElementsReader(store), cycle_start=n + 1,
                    policy=DecayPolicy(factor=0.5, limit=3))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_a_page_folded_at_once_equals_the_fold_event_by_event(
        ops: list[tuple[str, str, int]]) -> None:
    """A page of the log (sweeps rebinding the same elements, creations between them) folded
    by one apply_all is the state its events folded one at a time give."""
    async def run() -> None:
        folder = Path(tempfile.mkdtemp())
        store = await SqliteEventStore.open(folder / "events.db")
        try:
            for n, op in enumerate(ops):
                await apply_op(store, op, n)
            events = await store.read()
            fold = MemoryElements()
            one_by_one = fold.initial()
            for event in events:
                one_by_one = fold.apply(one_by_one, event)
            assert fold.apply_all(fold.initial(), events) == one_by_one
            for cut in range(len(events) + 1):  # a page may start and end anywhere
                head = fold.apply_all(fold.initial(), events[:cut])
                assert fold.apply_all(head, events[cut:]) == one_by_one
        finally:
            await store.close()
            shutil.rmtree(folder)

    asyncio.run(run())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, cut=st.integers(0, 25))
def test_a_fold_resumed_from_a_checkpoint_at_any_point_equals_a_fresh_fold(
        ops: list[tuple[str, str, int]], cut: int) -> None:
    async def run() -> None:
        folder = Path(tempfile.mkdtemp())
        store = await SqliteEventStore.open(folder / "events.db")
        try:
            for n, op in enumerate(ops[:cut]):
                await apply_op(store, op, n)
            saving = ElementsReader(store, checkpoints=folder / "ckpt")
            await saving.current()
            await saving.checkpoint()
            for n, op in enumerate(ops[cut:], start=cut):
                await apply_op(store, op, n)
            resumed = ElementsReader(store, checkpoints=folder / "ckpt")
            assert resumed.cursor == saving.cursor
            assert await resumed.current() == await ElementsReader(store).current()
        finally:
            await store.close()
            shutil.rmtree(folder)

    asyncio.run(run())
