"""Schema version 3 of the PostgreSQL log: indexes for the events page's kind and origin
filters, added to an existing version-2 log when its owner opens it."""

from __future__ import annotations

from pulse_core import EventDraft
from pulse_core.store import open_event_store
from tests.core.test_pg_principals import as_role, back_to_version_3, run, upgrade_refused
from tests.servers import PostgresServer

INDEXES = "SELECT string_agg(indexname, ',' ORDER BY indexname) FROM pg_indexes " \
          "WHERE schemaname = 'pulse' AND tablename = 'events'"


def tick(n: int, kind: str = "tick", origin: str = "engine") -> EventDraft:
    return EventDraft(kind, f"tick:{n % 50}", {"n": n}, origin=origin)


async def test_a_version_2_log_gains_the_kind_and_origin_indexes_when_its_owner_opens_it(
        pg_url: str, postgres_server: PostgresServer) -> None:
    database = pg_url.rsplit("/", 1)[1]
    store = await open_event_store(pg_url)
    for start in range(0, 3000, 500):
        await store.append([tick(n) for n in range(start, start + 500)])
    await store.append([EventDraft("task-created", "task:t-1", {"task": "t-1", "title": "x"},
                                   origin="agent:scout")])
    before = [(e.seq, e.id, e.kind, e.hash) for e in await store.read()]
    await store.close()
    await back_to_version_3(pg_url)
    await run(pg_url, "DROP INDEX pulse.events_kind", "DROP INDEX pulse.events_origin",
              "UPDATE pulse.meta SET value = '2' WHERE name = 'schema_version'")
    role = await upgrade_refused(pg_url, "version 3's indexes")
    assert postgres_server.sql(INDEXES, database) == "events_idem,events_key,events_pkey"

    store = await open_event_store(pg_url)
    try:
        assert postgres_server.sql(
            "SELECT value FROM pulse.meta WHERE name = 'schema_version'", database) == "5"
        assert postgres_server.sql(INDEXES, database) == \
            "events_idem,events_key,events_kind,events_origin,events_pkey"
        assert [(e.seq, e.id, e.kind, e.hash) for e in await store.read()] == before
        # what the events page asks of a rare kind or an origin reads the new indexes
        postgres_server.sql("ANALYZE pulse.events", database)
        for where in ("kind = 'task-created'", "origin LIKE 'agent:%'"):
            plan = postgres_server.sql(
                f"EXPLAIN SELECT * FROM pulse.events WHERE {where} ORDER BY seq DESC "
                "LIMIT 50", database)
            assert "events_kind" in plan or "events_origin" in plan, plan
        page = await store.read(kinds=["task-created"])
        assert [e.origin for e in page] == ["agent:scout"]
        await store.append([tick(9)])  # and it is written as before
    finally:
        await store.close()
    again = await open_event_store(as_role(pg_url, role))  # at version 5: nothing to do
    await again.close()


async def test_a_new_log_is_created_with_the_indexes(
        pg_url: str, postgres_server: PostgresServer) -> None:
    store = await open_event_store(pg_url)
    await store.close()
    database = pg_url.rsplit("/", 1)[1]
    assert "events_kind,events_origin" in postgres_server.sql(INDEXES, database)
