"""On PostgreSQL the database itself enforces principals: each role that writes the log is
listed in the schema's `principals` table, and a host that lies about its principal in its
own process is still refused by the server."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from pulse_core import EventDraft, EventStore, Principal, StoreError
from pulse_core.maintenance import Authority
from pulse_core.store import open_event_store, parse_store_url
from pulse_core.store._pg_ddl import append_in_one_sql, principals_sql
from tests.servers import PostgresServer


def as_role(url: str, role: str) -> str:
    """`url` with the user `role` in place of the superuser."""
    return url.replace("postgresql://pulse@", f"postgresql://{role}@", 1)


async def run(url: str, *statements: str) -> None:
    dsn = parse_store_url(url).dsn  # type: ignore[attr-defined]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            await conn.execute(statement)  # type: ignore[arg-type]


async def back_to_version_4(url: str) -> None:
    """Make the (version-5) log at `url` what version 4 made: the heads table, filled from
    the events, and version 4's append function, which moves it."""
    function = append_in_one_sql("pulse")
    await run(url, "CREATE TABLE pulse.heads (key text PRIMARY KEY, version bigint NOT NULL)",
              "INSERT INTO pulse.heads SELECT key, max(version) FROM pulse.events GROUP BY key",
              function[:function.index("DROP TRIGGER")],
              "UPDATE pulse.meta SET value = '4' WHERE name = 'schema_version'")


async def back_to_version_3(url: str) -> None:
    """Make the (version-5) log at `url` what version 3 made: version 4's and 5's objects
    dropped, version 2's row-by-row principals trigger as that version created it."""
    await back_to_version_4(url)
    v2 = principals_sql('"pulse"')
    await run(url, "DROP FUNCTION pulse.commit_if_heads",
              "DROP TRIGGER events_check_principals ON pulse.events",
              "DROP FUNCTION pulse.check_principals()",
              v2[v2.index("CREATE FUNCTION"):],  # its trigger, without its table
              "UPDATE pulse.meta SET value = '3' WHERE name = 'schema_version'")


async def make_role(url: str, kind: str, agent: str = "", *, listed: bool = True) -> str:
    """A login role that may use the log's tables, listed as a `kind` principal."""
    role = f"{kind}_{uuid.uuid4().hex[:8]}"
    await run(url, f"CREATE ROLE {role} LOGIN",
              f"GRANT USAGE ON SCHEMA pulse TO {role}",
              f"GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA pulse TO {role}",
              f"GRANT UPDATE ON pulse.writer_lock TO {role}",
              *([f"INSERT INTO pulse.principals VALUES ('{role}', '{kind}', '{agent}')"]
                if listed else []))
    return role


async def upgrade_refused(url: str, adds: str, kind: str = "engine", agent: str = "") -> str:
    """A role that is not the schema's owner (a `kind` principal), refused the upgrade that
    `adds` its objects (an UPGRADES name) when it opens the log at `url`; the role."""
    role = await make_role(url, kind, agent)
    with pytest.raises(StoreError, match=f"may not add {re.escape(adds)} — open it once as "
                                         "the schema's owner"):
        await open_event_store(as_role(url, role))
    return role


@pytest.fixture
async def owner(pg_url: str) -> AsyncIterator[EventStore]:
    """The log, created by the schema's owner."""
    store = await open_event_store(pg_url)
    yield store
    await store.close()


def task(n: int, origin: str) -> EventDraft:
    return EventDraft("task-created", f"task:t-{n}", {"task": f"t-{n}", "title": "x"},
                      origin=origin)


GRANT = EventDraft("grant-issued", "authority:agent",
                   {"principal": "agent", "permission": "purge"}, origin="human:forged")


async def test_an_agent_role_lying_about_its_principal_is_refused_by_the_server(
        pg_url: str, owner: EventStore) -> None:
    role = await make_role(pg_url, "agent", "hermes")
    # the hostile host claims to be a person in its own process: the server still refuses
    liar = await open_event_store(as_role(pg_url, role), principal=Principal.human("cli"))
    try:
        await liar.append([task(1, "agent:hermes")])
        for draft in (task(2, "human:ana"), task(3, "agent:openclaw"), task(4, "engine"),
                      GRANT):
            with pytest.raises(StoreError, match=f"role {role} .*may not write"):
                await liar.append([draft])
    finally:
        await liar.close()
    assert [(e.key, e.origin) for e in await owner.read()] == [("task:t-1", "agent:hermes")]
    assert await Authority(owner).grants("agent") == frozenset()


async def test_an_engine_role_writes_anything_but_a_persons_origin_or_kinds(
        pg_url: str, owner: EventStore) -> None:
    role = await make_role(pg_url, "engine")
    engine = await open_event_store(as_role(pg_url, role), principal=Principal.human("cli"))
    try:
        await engine.append([task(1, "engine"), task(2, "agent:hermes")])
        with pytest.raises(StoreError, match="may not write origin human:ana"):
            await engine.append([task(3, "human:ana")])
        with pytest.raises(StoreError, match="kind grant-issued: only a person"):
            await engine.append([EventDraft("grant-issued", "authority:agent", {
                "principal": "agent", "permission": "purge"}, origin="engine")])
    finally:
        await engine.close()
    assert [e.key for e in await owner.read()] == ["task:t-1", "task:t-2"]


async def test_a_person_role_writes_anything_and_an_unlisted_role_nothing(
        pg_url: str, owner: EventStore) -> None:
    person = await make_role(pg_url, "human")
    stranger = await make_role(pg_url, "engine", listed=False)
    store = await open_event_store(as_role(pg_url, person))
    try:
        await store.append([task(1, "human:ana"), GRANT])
    finally:
        await store.close()
    store = await open_event_store(as_role(pg_url, stranger))
    try:
        with pytest.raises(StoreError, match=f"role {stranger} is not a pulse principal"):
            await store.append([task(2, "engine")])
    finally:
        await store.close()
    assert [e.kind for e in await owner.read()] == ["task-created", "grant-issued"]


async def test_a_version_1_log_gains_the_principals_check_when_its_owner_opens_it(
        pg_url: str, postgres_server: PostgresServer) -> None:
    store = await open_event_store(pg_url)
    await store.append([task(1, "agent")])
    await store.close()
    await back_to_version_3(pg_url)
    await run(pg_url, "DROP TRIGGER events_check_principal ON pulse.events",
              "DROP FUNCTION pulse.check_principal()", "DROP TABLE pulse.principals",
              "UPDATE pulse.meta SET value = '1' WHERE name = 'schema_version'")
    role = await make_role(pg_url, "engine", listed=False)
    await run(pg_url, f"GRANT SELECT ON pulse.meta TO {role}")
    # a role that is not the owner cannot upgrade it, and says who can
    with pytest.raises(StoreError, match="open it once as the schema's owner"):
        await open_event_store(as_role(pg_url, role))
    store = await open_event_store(pg_url)
    await store.close()
    database = pg_url.rsplit("/", 1)[1]
    assert postgres_server.sql("SELECT value FROM pulse.meta WHERE name = 'schema_version'",
                               database) == "5"
    await run(pg_url, f"INSERT INTO pulse.principals VALUES ('{role}', 'agent', 'x')")
    agent = await open_event_store(as_role(pg_url, role))
    try:
        with pytest.raises(StoreError, match="may not write origin engine"):
            await agent.append([task(2, "engine")])
    finally:
        await agent.close()


async def test_a_schema_owner_whose_name_has_capitals_writes_without_being_listed(
        pg_url: str) -> None:
    # the owner check must compare the role's name, not its quoted identifier ("Ops_...")
    role = f"Ops_{uuid.uuid4().hex[:8]}"
    database = pg_url.rsplit("/", 1)[1]
    await run(pg_url, f'CREATE ROLE "{role}" LOGIN',
              f'GRANT CREATE ON DATABASE {database} TO "{role}"')
    store = await open_event_store(as_role(pg_url, role))
    try:
        await store.append([task(1, "agent:hermes")])
        assert [e.key for e in await store.read()] == ["task:t-1"]
    finally:
        await store.close()
