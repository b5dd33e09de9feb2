"""A lone PostgreSQL writer commits in one round trip against the heads it knows; when
another writer (another process) committed meanwhile, the server refuses that transaction
and the group is checked again against what the log holds: versions, conflicts and
gap-free seqs are as if every append had read the log."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_core import ManualClock, VersionConflict
from pulse_core.store import open_event_store
from tests.core.store_contract import draft
from tests.servers import PostgresServer


def database(url: str) -> str:
    return url.rsplit("/", 1)[1]


async def test_a_writer_that_knows_a_head_still_sees_another_writers_commit(
        pg_url: str, postgres_server: PostgresServer) -> None:
    a = await open_event_store(pg_url)
    b = await open_event_store(pg_url)
    try:
        await a.append([draft("k", 0)])
        await a.append([draft("k", 1)], expect={"k": 1})  # k known at 2 now
        await b.append([draft("k", 2)], expect={"k": 2})
        with pytest.raises(VersionConflict) as refused:
            await a.append([draft("k", 3)], expect={"k": 2})  # stale: the log holds 3
        assert refused.value.actual == 3
        await a.append([draft("k", 3)], expect={"k": 3})
        await a.append([draft("k", 4)])  # and it knows k again
        events = await b.read()
    finally:
        await a.close()
        await b.close()
    assert [(e.seq, e.version, e.data["n"]) for e in events] == \
        [(1, 1, 0), (2, 2, 1), (3, 3, 2), (4, 4, 3), (5, 5, 4)]
    assert postgres_server.sql("SELECT max(version) FROM pulse.events WHERE key = 'k'",
                               database(pg_url)) == "5"


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.tuples(st.integers(0, 2), st.sampled_from("abc")),
                     min_size=1, max_size=30),
       seed=st.integers(0, 2**16))
def test_interleaved_writers_leave_consecutive_seqs_and_versions(
        postgres_server: PostgresServer, plan: list[tuple[int, str]], seed: int) -> None:
    """Three writers (stores, as three processes), each append by a random one, some at
    once: every key's versions run 1, 2, 3... in seq order and seqs have no gap."""
    url = postgres_server.create_database()

    async def run() -> list[tuple[int, str, int]]:
        stores = [await open_event_store(url) for _ in range(3)]
        rng = random.Random(seed)
        try:
            for start in range(0, len(plan), 4):
                await asyncio.gather(*(stores[w].append([draft(k, i)]) for i, (w, k)
                                       in enumerate(plan[start:start + 4], start)
                                       if rng.random() < 0.9))
            return [(e.seq, e.key, e.version) for e in await stores[0].read()]
        finally:
            for store in stores:
                await store.close()

    rows = asyncio.run(run())
    assert [seq for seq, _, _ in rows] == list(range(1, len(rows) + 1))
    for key in "abc":
        assert [v for _, k, v in rows if k == key] == \
            list(range(1, sum(1 for _, k, _ in rows if k == key) + 1))


async def test_a_refused_one_trip_commit_moves_no_head(pg_url: str) -> None:
    a = await open_event_store(pg_url)
    b = await open_event_store(pg_url)
    try:
        await a.append([draft("k", 0)], expect={"n": 0})  # a knows k at 1, n at 0
        await b.append([draft("k", 1)])  # k at 2: a's knowledge is stale
        with pytest.raises(VersionConflict):
            await a.append([draft("n", 2), draft("k", 2)], expect={"k": 1})
        assert await b.head("n") == 0  # no head without its event
        assert [e.key for e in await b.read()] == ["k", "k"]
    finally:
        await a.close()
        await b.close()


async def test_writers_on_other_keys_leave_a_writers_events_at_the_seqs_and_ts_it_returns(
        pg_url: str, postgres_server: PostgresServer) -> None:
    """Each writer's commits interleave with the other's (each in one round trip: the heads
    it names are as it knows them); the events an append returns are the ones stored, and ts
    follows seq though the second writer's clock runs a second ahead of the first's."""
    slow, fast = ManualClock(1_700_000_000_000), ManualClock(1_700_000_001_000)
    a = await open_event_store(pg_url, clock=slow)
    b = await open_event_store(pg_url, clock=fast)
    returned = []
    try:
        for n in range(6):
            writer, key = (a, "a") if n % 2 == 0 else (b, "b")
            result = await writer.append([draft(key, n), draft(key, n)], expect={key: n - n % 2})
            returned += [(e.seq, e.key, e.version, e.ts) for e in result.events]
        stored = [(e.seq, e.key, e.version, e.ts) for e in await a.read()]
    finally:
        await a.close()
        await b.close()
    assert returned == stored
    assert [seq for seq, *_ in stored] == list(range(1, 13))
    assert [ts for *_, ts in stored] == [slow.now_ms()] * 2 + [fast.now_ms()] * 10
    assert postgres_server.sql("SELECT string_agg(key || version, ',' ORDER BY key) FROM "
                               "(SELECT DISTINCT ON (key) key, version FROM pulse.events "
                               "ORDER BY key, seq DESC) h", database(pg_url)) == "a6,b6"


async def test_a_lone_writer_checks_a_key_it_never_named_against_the_log(pg_url: str) -> None:
    """A writer whose commits follow one another (alone) sends a key it has not seen to be
    checked under the writer lock: a head given before it opened, or by another writer
    since, is found."""
    a = await open_event_store(pg_url)
    b = await open_event_store(pg_url)
    try:
        await b.append([draft("w", 0)])
        await a.append([draft("k", 1)])
        await a.append([draft("k", 2)])  # a's second commit: the log was where it left it
        result = await a.append([draft("w", 3)])  # no other writer since: w is still 1
        assert [(e.seq, e.version) for e in result.events] == [(4, 2)]
        await b.append([draft("x", 4)])
        with pytest.raises(VersionConflict) as refused:
            await a.append([draft("x", 5)], expect={"x": 0})
        assert refused.value.actual == 1
        await a.append([draft("k", 6)])
        await b.append([draft("y", 7)])
        result = await a.append([draft("y", 8)])  # no expectation: after b's y
        assert [(e.seq, e.version) for e in result.events] == [(8, 2)]
        events = await b.read()
    finally:
        await a.close()
        await b.close()
    assert [(e.seq, e.key, e.version) for e in events] == [
        (1, "w", 1), (2, "k", 1), (3, "k", 2), (4, "w", 2), (5, "x", 1), (6, "k", 3),
        (7, "y", 1), (8, "y", 2)]
