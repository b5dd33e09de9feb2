"""The memory read model (pulse_core._memory_view): every identity with its counts, and one
identity's records with who wrote each, folded from a real SQLite log without writing."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from pulse_core import (
    EventDraft,
    ManualClock,
    Memory,
    MemoryBoard,
    Projector,
    SqliteEventStore,
    read_identities,
    read_identity,
    summarise_identities,
)
from pulse_core.memory import StateRevised, TemporalFactRecorded

MINUTE = 60_000


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    opened = await SqliteEventStore.open(tmp_path / "events.db", clock=ManualClock())
    yield opened
    await opened.close()


def clock_of(store: SqliteEventStore) -> ManualClock:
    clock = store.recorder.clock
    assert isinstance(clock, ManualClock)
    return clock


async def test_every_identity_is_listed_with_its_record_counts_and_last_exchange(
    store: SqliteEventStore,
) -> None:
    board = MemoryBoard(store)
    await board.register("bob", "Bob")
    await board.register("ana", "Ana")
    await board.exchange("ana", "I moved to Lisbon")
    await board.exchange("ana", "Welcome to Lisbon!", role="agent")
    await board.set_state("ana", "city", "Lisbon")
    await board.set_state("ana", "job", "designer")
    await board.open_unresolved("ana", "ask how the move went")
    gone = await board.observe("ana", "phone", "battery", 80)
    await board.observe("ana", "phone", "battery", 79)
    await board.fact("ana", "stays with a friend until March")
    await board.reflect("ana", "Ana is settling in")
    await board.forget("ana", str(gone.data["record"]))

    listed = await read_identities(store)
    assert [(s.identity, s.name) for s in listed] == [("ana", "Ana"), ("bob", "Bob")]
    ana, bob = listed
    assert msgspec.to_builtins(ana.counts) == {
        "exchanges": 2, "state": 2, "unresolved": 1, "observations": 1, "facts": 1,
        "reflections": 1, "removed": 1}
    assert ana.last_exchange is not None
    assert (ana.last_exchange.text, ana.last_exchange.role) == ("Welcome to Lisbon!", "agent")
    assert ana.version == 11 and bob.last_exchange is None
    live = (await Projector(store, [Memory()]).catch_up())[Memory.name]
    assert summarise_identities(live) == listed


async def test_exchanges_are_listed_newest_first_and_bounded_with_the_total_counted(
    store: SqliteEventStore,
) -> None:
    board = MemoryBoard(store)
    said = [await board.exchange("ana", f"message {n}") for n in range(5)]
    records = await read_identity(store, "ana", shown=3)
    assert records is not None
    assert [x.text for x in records.exchanges] == ["message 4", "message 3", "message 2"]
    assert records.counts.exchanges == 5
    newest = records.exchanges[0]
    assert (newest.record, newest.seq, newest.at, newest.by, newest.role) == (
        said[4].data["record"], said[4].seq, said[4].ts, "human", "human")
    nothing = await read_identity(store, "ana", shown=0)
    assert nothing is not None and nothing.exchanges == () and nothing.counts.exchanges == 5


async def test_a_state_item_says_who_set_it_and_who_revised_it_last_and_why(
    store: SqliteEventStore,
) -> None:
    clock = clock_of(store)
    agent = MemoryBoard(store)
    reviewer = MemoryBoard(store, origin="executor:awareness")
    set_event = await agent.set_state("ana", "city", "Porto", confidence=0.5, protected=True)
    await agent.set_state("ana", "pet", "cat")
    clock.advance(MINUTE)
    await reviewer.write("ana", "state-revised", StateRevised(record="city", confidence=0.7,
                                                              reason="first hint"))
    clock.advance(MINUTE)
    last = await reviewer.write("ana", "state-revised", StateRevised(
        record="city", value="Lisbon", value_changed=True, reason="she said so"))
    records = await read_identity(store, "ana")
    assert records is not None
    city, pet = records.state
    assert (city.item, city.value, city.confidence, city.protected) == (
        "city", "Lisbon", 0.7, True)
    assert (city.set_by, city.set_at) == ("agent", set_event.ts)
    assert (city.revised_by, city.revised_at, city.revision_reason) == (
        "executor:awareness", last.ts, "she said so")
    assert (pet.item, pet.revised_by, pet.revised_at) == ("pet", None, None)

    clock.advance(MINUTE)
    human = MemoryBoard(store, origin="human")
    again = await human.set_state("ana", "city", "Faro")
    records = await read_identity(store, "ana")
    assert records is not None
    city = records.state[0]
    assert (city.value, city.set_by, city.set_at, city.revised_by, city.revision_reason) == (
        "Faro", "human", again.ts, None, "")


async def test_a_revision_of_an_item_that_does_not_exist_names_no_reviser(
    store: SqliteEventStore,
) -> None:
    board = MemoryBoard(store)
    await board.write("ana", "state-revised", StateRevised(record="city", confidence=0.2))
    await board.set_state("ana", "city", "Lisbon")
    records = await read_identity(store, "ana")
    assert records is not None
    assert records.state[0].revised_by is None and records.state[0].confidence == 1.0


async def test_unresolved_items_observations_facts_and_the_reflection_say_who_and_when(
    store: SqliteEventStore,
) -> None:
    clock = clock_of(store)
    board = MemoryBoard(store)
    low = await board.open_unresolved("ana", "water the plants", priority=0)
    high = await board.open_unresolved("ana", "ask about the move", priority=2)
    clock.advance(MINUTE)
    watcher = MemoryBoard(store, origin="watcher:phone")
    await watcher.observe("ana", "phone", "battery", 80)
    await watcher.observe("ana", "phone", "battery", 20, severity="warning", routine=False)
    fact = await board.fact("ana", "on holiday in May", valid_from=1_000, valid_until=2_000)
    await board.reflect("ana", "an older reflection")
    reflection = await board.reflect("ana", "Ana is settling in")
    records = await read_identity(store, "ana")
    assert records is not None
    assert [(u.record, u.opened_by, u.opened_at) for u in records.unresolved] == [
        (high.data["record"], "agent", high.ts), (low.data["record"], "agent", low.ts)]
    assert [(o.value, o.severity, o.routine, o.by) for o in records.observations] == [
        (20, "warning", False, "watcher:phone"), (80, "routine", True, "watcher:phone")]
    (only,) = records.facts
    assert (only.record, only.text, only.at, only.by, only.valid_from, only.valid_until) == (
        fact.data["record"], "on holiday in May", fact.ts, "agent", 1_000, 2_000)
    assert records.reflection is not None
    assert (records.reflection.text, records.reflection.at) == ("Ana is settling in",
                                                                reflection.ts)
    assert records.counts.reflections == 1


async def test_forgotten_and_quarantined_records_are_listed_without_their_content(
    store: SqliteEventStore,
) -> None:
    board = MemoryBoard(store)
    human = MemoryBoard(store, origin="human")
    said = await board.exchange("ana", "my PIN is 4321")
    seen = await board.observe("ana", "mic", "transcript", "a stranger's voice")
    fact = await board.fact("ana", "her secret address")
    await human.forget("ana", str(said.data["record"]), reason="Ana asked")
    await board.quarantine("ana", str(seen.data["record"]), reason="untrusted source")
    await board.forget("ana", str(fact.data["record"]))
    await board.forget("ana", str(fact.data["record"]), reason="twice")  # no second removal
    await board.forget("ana", "f-never-written")
    await board.write("ana", "temporal-fact-recorded", TemporalFactRecorded(
        record=str(fact.data["record"]), text="her secret address, again"))
    records = await read_identity(store, "ana")
    assert records is not None
    assert (records.exchanges, records.observations, records.facts) == ((), (), ())
    assert [(r.record, r.was, r.how, r.reason, r.by) for r in records.removed] == [
        ("f-never-written", "", "forgotten", "", "agent"),
        (fact.data["record"], "fact", "forgotten", "", "agent"),
        (seen.data["record"], "observation", "quarantined", "untrusted source", "agent"),
        (said.data["record"], "exchange", "forgotten", "Ana asked", "human"),
    ]
    assert records.counts.removed == 4
    shown = msgspec.json.encode(records).decode()
    for secret in ("4321", "stranger", "secret address"):
        assert secret not in shown


async def test_the_view_shows_what_the_memory_projection_holds(store: SqliteEventStore
                                                               ) -> None:
    board = MemoryBoard(store)
    for n in range(60):  # past the 50 exchanges the projection keeps
        await board.exchange("ana", f"message {n}")
    await board.set_state("ana", "city", "Lisbon")
    await board.write("ana", "state-retracted", {"record": "city"})
    await board.set_state("ana", "pet", "cat")
    opened = await board.open_unresolved("ana", "ask about the cat")
    await board.write("ana", "unresolved-resolved", {"record": opened.data["record"]})
    await board.reflect("ana", "first")
    reflection = await board.reflect("ana", "second")
    await board.forget("ana", str(reflection.data["record"]))
    memory = (await Projector(store, [Memory()]).catch_up())[Memory.name]["ana"]
    records = await read_identity(store, "ana", shown=100)
    assert records is not None
    assert [x.record for x in reversed(records.exchanges)] == [
        x.record for x in memory.exchanges]
    assert records.counts.exchanges == 50 and records.exchanges[-1].text == "message 10"
    assert [s.item for s in records.state] == list(memory.state) == ["pet"]
    assert records.unresolved == () and memory.unresolved == {}
    assert records.reflection is None and memory.reflection is None
    assert records.version == memory.version


async def test_an_identity_the_log_has_no_memory_of_reads_as_none(store: SqliteEventStore
                                                                  ) -> None:
    await MemoryBoard(store).exchange("ana", "hello")
    await store.append([EventDraft("task-created", "identity:carl", {"title": "not memory"})])
    assert await read_identity(store, "anna") is None
    assert await read_identity(store, "carl") is None
    assert [s.identity for s in await read_identities(store)] == ["ana"]
    with pytest.raises(ValueError, match="shown=-1"):
        await read_identity(store, "ana", shown=-1)


def files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


async def test_reading_a_log_opened_read_only_changes_no_file(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    writer = await SqliteEventStore.open(path)
    board = MemoryBoard(writer)
    for n in range(20):
        await board.exchange(f"id-{n % 3}", f"message {n}")
        await board.set_state(f"id-{n % 3}", "n", n)
    await writer.close()
    before = files(tmp_path)
    reader = await SqliteEventStore.open(path, read_only=True)
    try:
        assert [s.identity for s in await read_identities(reader)] == ["id-0", "id-1", "id-2"]
        one = await read_identity(reader, "id-1")
        assert one is not None and one.state[0].value == 19
    finally:
        await reader.close()
    assert files(tmp_path) == before
