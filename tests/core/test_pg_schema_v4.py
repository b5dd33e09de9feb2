"""Schema version 4 of the PostgreSQL log: the one-round-trip commit as a function of the
schema, and the principals checked once per statement; an existing version-3 log gains both
(and version 5 after them) when its owner opens it."""

from __future__ import annotations

import pytest

from pulse_core import EventDraft, StoreError
from pulse_core.store import open_event_store
from tests.core.test_pg_principals import as_role, back_to_version_3, upgrade_refused
from tests.servers import PostgresServer

OBJECTS = ("SELECT string_agg(x, ',' ORDER BY x) FROM (SELECT tgname::text AS x FROM "
           "pg_trigger WHERE tgrelid = 'pulse.events'::regclass AND NOT tgisinternal UNION "
           "SELECT proname FROM pg_proc WHERE pronamespace = 'pulse'::regnamespace) o")
V3_OBJECTS = ("check_principal,events_check_principal,events_refuse_truncate,"
              "events_refuse_update_delete,refuse_change")
V4_OBJECTS = ("check_principals,commit_if_heads,events_check_principals,"
              "events_refuse_truncate,events_refuse_update_delete,refuse_change")


def tick(n: int, origin: str = "engine") -> EventDraft:
    return EventDraft("tick", f"tick:{n % 5}", {"n": n}, origin=origin)


async def test_a_version_3_log_gains_the_append_function_when_its_owner_opens_it(
        pg_url: str, postgres_server: PostgresServer) -> None:
    database = pg_url.rsplit("/", 1)[1]
    store = await open_event_store(pg_url)
    await store.append([tick(n) for n in range(20)])
    before = [(e.seq, e.id, e.key, e.version, e.hash) for e in await store.read()]
    await store.close()
    await back_to_version_3(pg_url)
    assert postgres_server.sql(OBJECTS, database) == V3_OBJECTS
    role = await upgrade_refused(pg_url, "version 4's append function and principals trigger",
                                 "agent", "hermes")

    store = await open_event_store(pg_url)
    try:
        assert postgres_server.sql(
            "SELECT value FROM pulse.meta WHERE name = 'schema_version'", database) == "5"
        assert postgres_server.sql(OBJECTS, database) == V4_OBJECTS
        assert [(e.seq, e.id, e.key, e.version, e.hash) for e in await store.read()] == before
        for n in range(20, 30):  # known keys: the one-round-trip commit, through the function
            await store.append([tick(n)], expect={f"tick:{n % 5}": n // 5})
        events = await store.read()
        assert [e.seq for e in events] == list(range(1, 31))
        assert [e.version for e in events if e.key == "tick:0"] == list(range(1, 7))
    finally:
        await store.close()
    assert postgres_server.sql("SELECT max(version) FROM pulse.events WHERE key = 'tick:3'",
                               database) == "6"
    agent = await open_event_store(as_role(pg_url, role))  # at version 5: nothing to do
    try:
        await agent.append([tick(1, "agent:hermes")])
        with pytest.raises(StoreError, match=f"role {role} \\(agent hermes\\) may not write "
                                             "origin engine"):
            await agent.append([tick(2, "agent:hermes"), tick(3, "engine")])
    finally:
        await agent.close()
    assert postgres_server.sql("SELECT count(*) FROM pulse.events", database) == "31"


async def test_a_new_log_is_created_with_the_append_function(
        pg_url: str, postgres_server: PostgresServer) -> None:
    store = await open_event_store(pg_url)
    await store.close()
    database = pg_url.rsplit("/", 1)[1]
    assert postgres_server.sql(OBJECTS, database) == V4_OBJECTS
