"""Seed 004 section 37, the invariants of elements, metabolism and the retention ladder:
3, 4, 7, 8, 10, 11, 12, 13, 23, 24. Each runs the real code over a real SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pulse_core._errors import NotAuthorized, PurgeRefused
from pulse_core._events import EventDraft
from pulse_core._projector import Projector
from pulse_core.maintenance import Element, ElementsReader
from pulse_core.maintenance._activities import read_activity
from pulse_core.maintenance._authority import Authority
from pulse_core.maintenance._beliefs import BeliefBoard
from pulse_core.maintenance._element_kinds import InsightRecorded
from pulse_core.maintenance._metabolism import DecayPolicy, reinforce, sweep
from pulse_core.maintenance._retention import RetentionLadder
from pulse_core.memory import Memory, MemoryBoard, identity_key
from pulse_core.store import ObjectStore, SqliteEventStore
from pulse_core.store._base import EventStore

GRANTS = ("archive", "retention", "purge", "maintain")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EventStore]:
    opened = await SqliteEventStore.open(tmp_path / "events.db",
                                         objects=ObjectStore(tmp_path / "objects"))
    yield opened
    await opened.close()


def ladder(store: EventStore, grants: tuple[str, ...] = GRANTS,
           origin: str = "executor:maintenance") -> RetentionLadder:
    return RetentionLadder(store, ElementsReader(store),
                           Authority(store, standing={"maintenance": grants}), "maintenance",
                           origin=origin)


async def memory_of(store: EventStore, identity: str = "ana") -> Any:
    return (await Projector(store, [Memory()]).catch_up())["memory"][identity]


async def frozen(store: EventStore) -> tuple[bytes, Any, Any]:
    log = msgspec.json.encode(await store.read())
    memory = dict((await Projector(store, [Memory()]).catch_up())["memory"].items())
    return log, memory, dict((await ElementsReader(store).current()).elements.items())


async def insight(store: EventStore, record: str, *sources: str) -> None:
    await store.append([EventDraft("insight-recorded", identity_key("ana"), msgspec.to_builtins(
        InsightRecorded(record=record, text=record, derived_from=sources, activity="a-1")),
        origin="executor:maintenance")])


async def test_invariant_03_confidence_is_not_memory_strength(store: EventStore) -> None:
    assert "confidence" not in Element.__struct_fields__  # an element cannot even hold one
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon", confidence=0.6)
    reader = ElementsReader(store)
    await sweep(store, reader, cycle_start=1_000)
    await reinforce(store, reader, "ana", "city", strength=0.2)
    assert (await memory_of(store)).state["city"].confidence == 0.6
    await board.write("ana", "state-revised", {"record": "city", "confidence": 0.95})
    assert (await reader.current()).elements["ana/city"].strength == 0.2
    assert (await memory_of(store)).state["city"].confidence == 0.95


async def test_invariant_04_disuse_does_not_lower_truth_confidence(store: EventStore) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon", confidence=0.7)
    made = await BeliefBoard(store).assert_("ana", "job", "baker", confidence=0.8)
    reader = ElementsReader(store)
    for week in range(1, 120):  # far past the floor: strength bottoms out, truth does not
        await sweep(store, reader, cycle_start=week * 604_800_000,
                    policy=DecayPolicy(factor=0.95))
    state = await reader.current()
    assert state.elements["ana/city"].strength == 0.05
    assert (await memory_of(store)).state["city"].confidence == 0.7
    beliefs, _ = await BeliefBoard(store).read("ana")
    assertion = beliefs.assertion(made.data["record"])
    assert assertion is not None and assertion.confidence == 0.8
    kinds = {e.kind for e in await store.read(after_seq=made.seq)}
    assert kinds == {"memory-metabolized"}


async def test_invariant_07_evidence_is_append_and_correction_oriented(
    store: EventStore,
) -> None:
    board = MemoryBoard(store)
    old = (await board.observe("ana", "scale", "kg", 80)).data["record"]
    new = (await board.observe("ana", "scale", "kg", 70)).data["record"]
    before = await store.read()
    await ladder(store).correct("ana", old, new, "miscalibrated")
    after = await store.read()
    assert after[:len(before)] == before  # nothing rewritten: the correction is appended
    added = [e.kind for e in after[len(before):]]
    assert added == ["evidence-corrected", "activity-recorded"]
    observations = (await memory_of(store)).observations
    assert observations[old].value == 80 and observations[new].value == 70
    state = await ElementsReader(store).current()
    assert state.elements[f"ana/{old}"].corrected_by == f"ana/{new}"
    assert state.elements[f"ana/{new}"].corrects == f"ana/{old}"
    audit = await read_activity(store, after[-1].key.removeprefix("activity:"))
    assert audit is not None and audit.activity_class == "evidence_correction"


async def test_invariant_08_counter_evidence_is_not_disposable_noise(store: EventStore) -> None:
    board = MemoryBoard(store)
    beliefs = BeliefBoard(store)
    await beliefs.assert_("ana", "city", "Lisbon", origin="agent")
    seen = (await board.observe("ana", "gps", "city", "Porto")).data["record"]
    await beliefs.assert_("ana", "city", "Porto", origin="human:bo",
                          evidence=(f"ana/{seen}",))  # the counter-evidence, cited
    lad = ladder(store)
    await sweep(store, lad.reader, cycle_start=1_000)
    await lad.archive(f"ana/{seen}")
    await lad.tombstone(f"ana/{seen}")
    before = await frozen(store)
    with pytest.raises(PurgeRefused, match="referenced"):
        await lad.purge(f"ana/{seen}", confirm=f"ana/{seen}")
    assert await frozen(store) == before
    assert seen in (await memory_of(store)).observations


async def test_invariant_10_archive_is_not_retraction(store: EventStore) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon", confidence=0.9)
    made = await BeliefBoard(store).assert_("ana", "job", "baker")
    lad = ladder(store)
    await lad.archive("ana/city")
    await lad.archive(f"ana/{made.data['record']}")
    item = (await memory_of(store)).state["city"]
    assert (item.value, item.confidence) == ("Lisbon", 0.9)
    beliefs, _ = await BeliefBoard(store).read("ana")
    assert [a.value for a in beliefs.active("job")] == ["baker"]
    element = (await lad.reader.current()).elements["ana/city"]
    assert element.stage == "archived" and not element.retracted
    assert not await store.read(kinds=["state-retracted", "record-forgotten"])


async def test_invariant_11_tombstone_is_not_purge(store: EventStore) -> None:
    await MemoryBoard(store).set_state("ana", "city", "Lisbon")
    lad = ladder(store)
    await lad.archive("ana/city")
    await lad.tombstone("ana/city")
    state = await lad.reader.current()
    assert state.elements["ana/city"].stage == "tombstoned" and "ana/city" not in state.purged
    assert (await memory_of(store)).state["city"].value == "Lisbon"
    with pytest.raises(NotAuthorized):  # a tombstone gives no licence to purge
        await ladder(store, grants=("archive", "retention")).purge("ana/city",
                                                                  confirm="ana/city")
    await lad.purge("ana/city", confirm="ana/city")
    assert "city" not in (await memory_of(store)).state


async def test_invariant_12_purge_is_exceptional(store: EventStore) -> None:
    await MemoryBoard(store).set_state("ana", "city", "Lisbon")
    lad = ladder(store)
    start = await frozen(store)
    with pytest.raises(PurgeRefused, match="archive"):
        await lad.purge("ana/city", confirm="ana/city")  # never straight from active
    assert await frozen(store) == start
    await lad.archive("ana/city")
    before = await frozen(store)
    with pytest.raises(NotAuthorized, match="'purge'"):
        await ladder(store, grants=("archive",)).purge("ana/city", confirm="ana/city")
    with pytest.raises(PurgeRefused, match="not confirmed"):
        await lad.purge("ana/city", confirm="city")
    assert await frozen(store) == before
    await lad.purge("ana/city", confirm="ana/city", reason="subject asked")
    audit = await read_activity(store, "purge:ana/city")
    assert audit is not None and audit.activity_class == "purge"
    assert audit.report["reason"] == "subject asked"


async def test_invariant_13_legal_hold_blocks_purge(store: EventStore) -> None:
    await store.append([EventDraft("observation-recorded", identity_key("ana"), {
        "record": "o-1", "source": "cam", "key": "photo"}, origin="watcher:cam",
        attachment=b"bytes")])
    lad = ladder(store)
    await lad.archive("ana/o-1")
    await lad.set_hold("ana/o-1", "litigation")
    before = await frozen(store)
    with pytest.raises(PurgeRefused, match="legal hold"):
        await lad.purge("ana/o-1", confirm="ana/o-1")
    with pytest.raises(PurgeRefused, match="legal hold"):
        await lad.purge_payload("ana/o-1", confirm="ana/o-1")
    assert await frozen(store) == before
    await ladder(store, origin="human:legal").release_hold("ana/o-1")
    await lad.purge("ana/o-1", confirm="ana/o-1")
    assert "ana/o-1" in (await lad.reader.current()).purged


async def test_invariant_23_stale_is_a_review_flag_never_an_auto_retraction(
    store: EventStore,
) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon")
    await insight(store, "i-1", "city")
    await insight(store, "i-2", "i-1")
    await board.write("ana", "state-revised", {"record": "city", "value": "Porto",
                                               "value_changed": True})
    lad = ladder(store)
    before = (await lad.reader.current()).elements
    mark = await store.last_seq()
    assert await lad.mark_stale("ana/city") == ["ana/i-1", "ana/i-2"]
    after = await lad.reader.current()
    for eid in ("ana/i-1", "ana/i-2"):
        flagged, was = after.elements[eid], before[eid]
        assert flagged.stale and flagged.stale_roots == ("ana/city",)
        assert (flagged.stage, flagged.retracted, flagged.strength, flagged.salience) == (
            was.stage, was.retracted, was.strength, was.salience)
    kinds = [e.kind for e in await store.read(after_seq=mark)]
    assert sorted(set(kinds)) == ["activity-recorded", "derivation-stale"]


async def test_invariant_24_payload_purge_preserves_the_evidence_event_element_purge_destroys_it(
    store: EventStore,
) -> None:
    assert store.objects is not None
    events = (await store.append([
        EventDraft("observation-recorded", identity_key("ana"), {
            "record": rec, "source": "mic", "key": "voice"}, origin="watcher:mic",
            attachment=body) for rec, body in (("o-1", b"one"), ("o-2", b"two"))])).events
    lad = ladder(store)
    await lad.purge_payload("ana/o-1", confirm="ana/o-1")
    await lad.archive("ana/o-2")
    await lad.purge("ana/o-2", confirm="ana/o-2")
    assert not store.objects.exists(events[0].hash or "")
    assert not store.objects.exists(events[1].hash or "")
    state = await lad.reader.current()
    kept = state.elements["ana/o-1"]
    assert kept.payload_purged and kept.digest == events[0].hash
    assert "ana/o-2" not in state.elements and "ana/o-2" in state.purged
    observations = (await memory_of(store)).observations
    assert "o-1" in observations and "o-2" not in observations
    logged = await store.read(kinds=["observation-recorded"])
    assert logged[0] == events[0]  # the evidence event itself, digest and all
