"""One recall: what maintenance decides (archive, tombstone, purge, strength) is what recall
returns, on a home whose element text is sealed, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulse_core import EventStore, NotAuthorized, open_home
from pulse_core.maintenance import (
    AGENT,
    BACKGROUND,
    HUMAN,
    Authority,
    DecayPolicy,
    ElementsReader,
    RetentionLadder,
    reinforce,
    sweep,
    verify_import,
)
from pulse_core.memory import (
    MemoryBoard,
    Recalled,
    RecallQuery,
    RecallRefused,
    UnknownIdentity,
    identity_key,
    recall,
    recallable,
    recallable_from_events,
    remember,
)
from tests.timing import LoopTurns, past_the_newest

GRANTS = ("archive", "retention", "purge", "maintain")


@pytest.fixture
async def store(store_url: str, tmp_path: Path) -> AsyncIterator[EventStore]:
    """A home's event log with its element keys: the home's events.db, or a PostgreSQL
    database (store_url, tests/conftest.py)."""
    stores = await open_home(tmp_path / "home", store=store_url)
    assert stores.events.keys is not None
    yield stores.events
    await stores.close()


def ladder(store: EventStore, origin: str = "executor:maintenance") -> RetentionLadder:
    authority = Authority(store, standing={"maintenance": GRANTS})
    return RetentionLadder(store, ElementsReader(store), authority, "maintenance",
                           origin=origin)


def records(found: list[Recalled]) -> list[str]:
    return [r.record for r in found]


async def test_text_search_opens_sealed_text_and_ranks_by_authority(store: EventStore) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon by the river", confidence=0.9)
    said = await board.exchange("ana", "I love the river walks in Lisbon")
    await board.fact("ana", "works in Porto")
    await board.set_state("bob", "city", "Porto")
    found = await recall(store, RecallQuery(text="LISBON river"))
    assert records(found) == ["city", said.data["record"]] or records(found) == [
        said.data["record"], "city"]
    assert {r.identity for r in found} == {"ana"}
    assert any(r.text == "city: Lisbon by the river" for r in found)  # opened, not sealed
    porto = await recall(store, RecallQuery(text="porto"))
    assert {(r.identity, r.type) for r in porto} == {("ana", "fact"), ("bob", "state")}
    human = await MemoryBoard(store, origin="human").set_state("bob", "job", "porto docks")
    ranked = await recall(store, RecallQuery(text="porto"))
    assert ranked[0].record == human.data["record"] and ranked[0].authority == HUMAN
    assert len(await recall(store, RecallQuery(text="porto", limit=1))) == 1


async def test_an_archived_element_leaves_recall_unless_asked_and_tombstoned_never_returns(
    store: EventStore,
) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon")
    await board.set_state("ana", "pet", "a cat named Lisbon")
    lad = ladder(store)
    await lad.archive("ana/city", "old")
    assert records(await recall(store, RecallQuery(identity="ana"))) == ["pet"]
    with_archived = await recall(store, RecallQuery(identity="ana", include_archived=True))
    assert sorted(records(with_archived)) == ["city", "pet"]
    assert {r.stage for r in with_archived} == {"active", "archived"}
    await lad.set_hold("ana/city", "legal")  # a hold keeps it as its stage says
    assert records(await recall(store, RecallQuery(text="lisbon"))) == ["pet"]
    await ladder(store, origin="human:ops").release_hold("ana/city")
    await lad.tombstone("ana/city")
    assert records(await recall(store, RecallQuery(identity="ana", include_archived=True))
                   ) == ["pet"]


async def test_recallable_leaves_out_what_recall_does_read_once_or_from_events_given(
    store: EventStore,
) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon")
    await board.set_state("ana", "pet", "a cat")
    await board.set_state("ana", "job", "baker")
    lad = ladder(store)
    await lad.archive("ana/city", "old")
    await lad.archive("ana/job", "old")
    await lad.tombstone("ana/job")
    history = await store.read(key=identity_key("ana"))
    memory = None
    for event in history:
        memory = remember(memory, event)
    assert memory is not None and set(memory.state) == {"city", "pet", "job"}
    shown = await recallable(store, memory)
    assert set(shown.state) == {"pet"}
    assert recallable_from_events(memory, history) == shown
    assert set(recallable_from_events(memory, history, include_archived=True).state) == {
        "city", "pet"}  # a tombstoned element never
    assert set((await recallable(store, memory, include_archived=True)).state) == {
        "city", "pet"}
    assert recallable_from_events(memory, []) == memory  # nothing maintenance decided: all


async def test_purged_and_forgotten_never_return(store: EventStore) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon")
    fact = await board.fact("ana", "lives in Lisbon")
    said = await board.exchange("ana", "Lisbon is home")
    lad = ladder(store)
    await lad.archive("ana/city")
    await lad.purge("ana/city", confirm="ana/city")
    await lad.finish_purges()
    await board.forget("ana", fact.data["record"])
    for archived in (False, True):
        found = await recall(store, RecallQuery(text="lisbon", include_archived=archived))
        assert records(found) == [said.data["record"]]
        found = await recall(store, RecallQuery(identity="ana", include_archived=archived))
        assert records(found) == [said.data["record"]]


async def test_a_reinforced_element_outranks_a_decayed_one(store: EventStore) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "coffee", "black coffee")    # older
    await past_the_newest(store)
    await board.set_state("ana", "tea", "green tea")          # newer: ranks first at equal
    assert records(await recall(store, RecallQuery(identity="ana"))) == ["tea", "coffee"]
    reader = ElementsReader(store)
    policy = DecayPolicy(factor=0.5, floor=0.05, protection=0.9)
    await sweep(store, reader, cycle_start=1, policy=policy)
    await reinforce(store, reader, "ana", "coffee", strength=1.0, reason="used today")
    found = await recall(store, RecallQuery(identity="ana"))
    assert records(found) == ["coffee", "tea"]
    assert found[0].strength == 1.0 and found[1].strength == 0.5


async def test_bad_queries_are_refused_by_field(store: EventStore) -> None:
    await MemoryBoard(store).set_state("ana", "city", "Lisbon")
    with pytest.raises(RecallRefused, match="identity, a topic or a text") as nothing:
        await recall(store, RecallQuery())
    assert nothing.value.field == "query"
    for query, field in ((RecallQuery(text="a", limit=0), "limit"),
                         (RecallQuery(text="  "), "text"),
                         (RecallQuery(topic=""), "topic"),
                         (RecallQuery(text="a", types=("state", "dream")), "types")):
        with pytest.raises(RecallRefused) as refused:
            await recall(store, query)
        assert refused.value.field == field
    with pytest.raises(UnknownIdentity, match="'zoe'") as unknown:
        await recall(store, RecallQuery(identity="zoe"))
    assert unknown.value.identity == "zoe" and unknown.value.field == "identity"
    assert records(await recall(store, RecallQuery(topic="CITY"))) == ["city"]
    await MemoryBoard(store).fact("ana", "born in Lisbon")
    facts = await recall(store, RecallQuery(text="lisbon", types=("fact",)))
    assert [r.type for r in facts] == ["fact"]


@given(st.lists(st.tuples(st.integers(0, 2), st.floats(0, 1), st.integers(0, 10**6)),
                max_size=30))
def test_ranking_puts_authority_first_then_score(rows: list[tuple[int, float, int]]) -> None:
    from pulse_core._recall import rank_key

    items = [Recalled(identity="a", record=str(i), type="state", text="", authority=a,
                      confidence=1.0, strength=s, stage="active", at=t, score=s)
             for i, (a, s, t) in enumerate(rows)]
    ranked = sorted(items, key=lambda r: rank_key(r.authority, r.score, r.at, r.identity,
                                                  r.record))
    for better, worse in itertools.pairwise(ranked):
        assert (better.authority, better.score) >= (worse.authority, worse.score)


def keys_bytes(store: EventStore) -> bytes:
    assert store.keys is not None
    path = store.keys.path
    return b"".join(p.read_bytes() for p in (path, path.with_name(path.name + "-wal"))
                    if p.exists())


async def test_the_text_index_lives_beside_the_keys_and_a_purge_erases_its_words(
    store: EventStore,
) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "secret", "the zanzibarword vault")
    await board.set_state("ana", "city", "Lisbon")
    assert store.keys is not None and store.keys.search(["zanzibar"]) == {"ana/secret"}
    found = await recall(store, RecallQuery(text="zanzib"))  # a word's start matches
    assert [(r.record, r.text) for r in found] == [("secret", "secret: the zanzibarword vault")]
    assert b"zanzibarword" in keys_bytes(store)
    log = await store.read()
    assert not any(b"zanzibarword" in repr(e.data).encode() for e in log)  # sealed in the log
    lad = ladder(store)
    await lad.archive("ana/secret")
    await lad.purge("ana/secret", confirm="ana/secret")
    await lad.finish_purges()
    assert await recall(store, RecallQuery(text="zanzibar", include_archived=True)) == []
    assert store.keys.search(["zanzibar"]) == set()
    assert b"zanzibarword" not in keys_bytes(store)
    assert records(await recall(store, RecallQuery(text="lisbon"))) == ["city"]


async def test_a_kept_recaller_sees_what_was_appended_and_archived_since(
    store: EventStore,
) -> None:
    from pulse_core.memory import Recaller

    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon")
    recaller = Recaller(store)
    assert records(await recaller.recall(RecallQuery(text="lisbon"))) == ["city"]
    await board.fact("ana", "born in Lisbon")
    await ladder(store).archive("ana/city")
    found = await recaller.recall(RecallQuery(text="lisbon"))
    assert [r.type for r in found] == ["fact"]
    with pytest.raises(RecallRefused):
        await recaller.recall(RecallQuery(limit=5))


async def test_a_kept_recaller_opens_a_state_items_revised_value(store: EventStore) -> None:
    from pulse_core.memory import Recaller

    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon harbour")
    recaller = Recaller(store)
    assert [r.text for r in await recaller.recall(RecallQuery(text="harbour"))] == [
        "city: Lisbon harbour"]
    await board.set_state("ana", "city", "Porto harbour")  # the same record, a new value
    assert [r.text for r in await recaller.recall(RecallQuery(text="harbour"))] == [
        "city: Porto harbour"]


async def test_a_kept_recaller_finds_an_observation_recorded_after_its_first_recall(
    store: EventStore,
) -> None:
    from pulse_core.memory import Recaller

    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon")
    await board.set_state("bob", "pet", "a cat")
    recaller = Recaller(store)
    assert records(await recaller.recall(RecallQuery(text="lisbon"))) == ["city"]
    # plain text, out of the index: found only because bob is now among the observed
    seen = await board.observe("bob", "gps", "place", "Lisbon harbour")
    found = await recaller.recall(RecallQuery(text="lisbon"))
    assert sorted((r.identity, r.record) for r in found) == [
        ("ana", "city"), ("bob", seen.data["record"])]
    await board.forget("bob", seen.data["record"])
    assert records(await recaller.recall(RecallQuery(text="lisbon"))) == ["city"]


async def test_a_kept_recaller_sees_what_another_handle_on_the_log_appended(
    store_url: str, tmp_path: Path,
) -> None:
    from pulse_core.memory import Recaller

    home = tmp_path / "home"
    stores = await open_home(home, store=store_url)
    other = await open_home(home, store=store_url)  # as another process would
    try:
        await MemoryBoard(stores.events).set_state("ana", "city", "Lisbon")
        recaller = Recaller(stores.events)
        assert records(await recaller.recall(RecallQuery(text="lisbon"))) == ["city"]
        assert records(await recaller.recall(RecallQuery(text="lisbon"))) == ["city"]
        wakes = stores.events.wakes
        fact = await MemoryBoard(other.events).fact("ana", "born in Lisbon")
        assert stores.events.wakes == wakes  # only a read of the log's seq can tell
        found = await recaller.recall(RecallQuery(text="lisbon"))
        assert sorted(records(found)) == sorted(["city", fact.data["record"]])
        await ladder(other.events).archive("ana/city")
        assert records(await recaller.recall(RecallQuery(text="lisbon"))) == [
            fact.data["record"]]
    finally:
        await other.close()
        await stores.close()


async def agent_then(store: EventStore, origin: str) -> None:
    """ana's `city` as the agent said it, then her `home` as `origin` said it: newer (the
    clock moved on), so at equal authority it ranks first. Both hold "Lisbon"."""
    await MemoryBoard(store).set_state("ana", "city", "Lisbon")
    await past_the_newest(store)
    await MemoryBoard(store, origin=origin).set_state("ana", "home", "Lisbon")


async def test_an_unverified_import_ranks_below_the_agents_own_word_until_a_person_verifies_it(
    store: EventStore,
) -> None:
    from pulse_core.memory import Recaller

    await agent_then(store, "agent:import:wiki")
    recaller = Recaller(store)
    for found in (await recall(store, RecallQuery(text="lisbon")),
                  await recaller.recall(RecallQuery(text="lisbon"))):
        assert [(r.record, r.authority) for r in found] == [("city", AGENT),
                                                             ("home", BACKGROUND)]
    with pytest.raises(NotAuthorized):
        await verify_import(store, "ana/home", origin="agent")
    assert records(await recaller.recall(RecallQuery(text="lisbon"))) == ["city", "home"]
    await verify_import(store, "ana/home", origin="human:ops", reason="checked the source")
    for found in (await recall(store, RecallQuery(text="lisbon")),
                  await recaller.recall(RecallQuery(text="lisbon"))):
        assert [(r.record, r.authority) for r in found] == [("home", AGENT), ("city", AGENT)]


async def test_recall_ranks_the_import_origins_it_is_given_as_background_writers(
    store: EventStore,
) -> None:
    from pulse_core.memory import Recaller

    # a feed the home's maintenance settings name as an import origin (imports.origins);
    # pulse's defaults do not hold it, so by default it ranks as the agent's own word
    await agent_then(store, "agent:rss:news")
    by_default = await recall(store, RecallQuery(text="lisbon"))
    assert [(r.record, r.authority) for r in by_default] == [("home", AGENT), ("city", AGENT)]
    origins = ("agent:rss",)
    for found in (await recall(store, RecallQuery(text="lisbon"), import_origins=origins),
                  await Recaller(store, import_origins=origins).recall(
                      RecallQuery(text="lisbon"))):
        assert [(r.record, r.authority) for r in found] == [("city", AGENT),
                                                             ("home", BACKGROUND)]


async def test_a_recallers_thread_ends_when_the_recaller_is_dropped(store: EventStore) -> None:
    import gc
    import threading

    from pulse_core.memory import Recaller

    def recall_threads() -> set[threading.Thread]:
        """The live recall threads (an earlier test's may still be ending: only the ones
        this test started are judged)."""
        return {t for t in threading.enumerate() if t.name == "pulse-recall"}

    async def settled(done: Callable[[], bool]) -> None:
        for _ in range(400):
            if done():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the recall threads did not settle in 4 s")

    await MemoryBoard(store).set_state("ana", "city", "Lisbon")
    before = recall_threads()
    recaller = Recaller(store)
    for _ in range(2):  # a fold, then the kept fold
        assert records(await recaller.recall(RecallQuery(text="lisbon"))) == ["city"]
    (kept,) = recall_threads() - before  # the Recaller's own, started at its first recall
    assert records(await recall(store, RecallQuery(text="lisbon"))) == ["city"]  # one-shot
    await settled(lambda: recall_threads() - before == {kept})  # the one-shot's ended with it
    del recaller
    gc.collect()
    await settled(lambda: not kept.is_alive())


def test_a_recall_thread_outlives_an_event_loop_closed_while_its_job_ran() -> None:
    import asyncio
    import threading

    from pulse_core._waits import JobThread

    thread = JobThread("pulse-recall-test")
    started, release = threading.Event(), threading.Event()

    def blocked() -> int:
        started.set()
        release.wait(5)
        return 1

    async def first() -> None:
        waiting = asyncio.ensure_future(thread.call(blocked))
        await asyncio.to_thread(started.wait, 5)
        assert not waiting.done()

    asyncio.run(first())  # its loop closes while the job runs: no one waits for its result
    release.set()

    async def second() -> int:
        return await asyncio.wait_for(thread.call(lambda: 2), 5)

    assert asyncio.run(second()) == 2
    thread.stop_soon()


async def test_a_recall_does_not_wait_for_another_still_selecting(store: EventStore) -> None:
    import asyncio
    import threading

    from pulse_core.memory import Recaller

    await MemoryBoard(store).set_state("ana", "city", "Lisbon")
    recaller = Recaller(store)
    assert records(await recaller.recall(RecallQuery(text="lisbon"))) == ["city"]
    selecting, release = threading.Event(), threading.Event()
    select = recaller._select

    def slow(folded: Any, query: RecallQuery) -> list[Recalled]:
        if query.limit == 7:  # the slow one: a common word's selection, say
            selecting.set()
            release.wait(5)
        return select(folded, query)

    recaller._select = slow  # type: ignore[method-assign]
    slow_one = asyncio.ensure_future(recaller.recall(RecallQuery(text="lisbon", limit=7)))
    try:
        assert await asyncio.to_thread(selecting.wait, 5)
        found = await asyncio.wait_for(recaller.recall(RecallQuery(text="lisbon")), 2)
        assert records(found) == ["city"] and not slow_one.done()
    finally:
        release.set()
    assert records(await slow_one) == ["city"]


async def test_a_kept_recall_lets_the_loop_turn_and_a_slow_selection_never_holds_it(
    tmp_path: Path
) -> None:
    """A kept Recaller's loop thread waits for a quick selection, yet each recall lets the
    other coroutines run; a selection that blocks (keys.db stalled, say) holds the loop at
    most INLINE_SELECTION: the loop turns while it waits, and the recall returns once it
    ends, as do the recalls after it (and their errors)."""
    import threading

    from pulse_core.memory import Recaller

    stores = await open_home(tmp_path / "home")
    try:
        await MemoryBoard(stores.events).set_state("ana", "city", "Lisbon")
        recaller = Recaller(stores.events)
        assert records(await recaller.recall(RecallQuery(text="lisbon"))) == ["city"]  # folds
        async with LoopTurns() as loop:
            for i in range(20):
                seen = loop.turns
                assert records(await recaller.recall(RecallQuery(text="lisbon"))) == ["city"]
                assert loop.turns > seen, f"recall {i} ran without letting another coroutine run"

        selecting, release = threading.Event(), threading.Event()
        select = recaller._select

        def stalled(folded: Any, query: RecallQuery) -> list[Recalled]:
            if query.limit == 7:
                selecting.set()
                release.wait(60)
            return select(folded, query)

        recaller._select = stalled  # type: ignore[method-assign]
        # Only if the loop itself were stuck in the wait would this end the stall.
        rescue = threading.Timer(60, release.set)
        rescue.start()
        try:
            waiting = asyncio.ensure_future(recaller.recall(RecallQuery(text="lisbon",
                                                                        limit=7)))
            # Awaiting a thread needs the loop to turn while the selection is stalled.
            assert await asyncio.to_thread(selecting.wait, 60)
            assert not release.is_set(), "the loop stood still until the selection ended"
            assert not waiting.done()
            release.set()
            assert records(await waiting) == ["city"]
        finally:
            rescue.cancel()
        for _ in range(3):  # the first after it goes to the thread, then one waits again
            assert records(await recaller.recall(RecallQuery(text="lisbon"))) == ["city"]
        with pytest.raises(UnknownIdentity):  # raised in the thread, handed to the caller
            await recaller.recall(RecallQuery(text="lisbon", identity="bob"))
    finally:
        await stores.close()
