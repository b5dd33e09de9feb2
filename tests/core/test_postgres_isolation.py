"""The PostgreSQL log whatever the database's default isolation: a DBA may set REPEATABLE
READ or SERIALIZABLE as policy, and appends must still see the commit they waited for."""

from __future__ import annotations

import asyncio

import pytest

from pulse_core.store import open_event_store
from tests.core.store_contract import draft
from tests.servers import PostgresServer


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
async def test_appends_stay_gap_free_under_a_stricter_default_isolation(
        pg_url: str, postgres_server: PostgresServer, isolation: str) -> None:
    database = pg_url.rsplit("/", 1)[1]
    postgres_server.sql(f"ALTER DATABASE {database} SET default_transaction_isolation "
                        f"TO '{isolation}'")
    stores = [await open_event_store(pg_url) for _ in range(2)]
    try:
        async def appender(n: int) -> None:
            for i in range(30):
                await stores[n].append([draft(f"k{i % 3}")])

        await asyncio.gather(appender(0), appender(1))
        events = await stores[0].read()
        assert [e.seq for e in events] == list(range(1, 61))
        for key in ("k0", "k1", "k2"):
            assert [e.version for e in events if e.key == key] == list(range(1, 21))
    finally:
        for store in stores:
            await store.close()
