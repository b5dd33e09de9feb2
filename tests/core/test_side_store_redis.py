"""The side store in Redis: keys that the server expires, namespaces apart, read-only views,
and an outage that fails fast with StoreUnavailable and heals when the server is back."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio

from pulse_core import Engine, StoreClosed, StoreError, StoreReadOnly, StoreUnavailable, open_home
from pulse_core.store import SqliteSideStore, open_side_store
from pulse_core.store._redis import RedisSideStore
from tests.servers import LOOPBACK, RedisServer

_databases = itertools.count(1)


@pytest.fixture
async def redis_db(redis_server: RedisServer) -> AsyncIterator[str]:
    """The URL of an emptied database of its own in the session's redis-server (1..15)."""
    db = next(_databases) % 15 + 1
    raw = redis.asyncio.Redis(host=LOOPBACK, port=redis_server.port, db=db)
    try:
        await raw.flushdb()
        yield redis_server.url(db)
    finally:
        await raw.aclose()


async def raw_keys(url: str) -> dict[bytes, int]:
    """Every key of the database `url` names, with its time to live in ms (-1: none)."""
    server = await open_side_store(url)
    assert isinstance(server, RedisSideStore)
    host, port, db = server.url.host, server.url.port, server.url.db
    await server.close()
    raw = redis.asyncio.Redis(host=host, port=port, db=db)
    try:
        keys = [bytes(k) for k in await raw.keys("*") if isinstance(k, bytes)]
        return {key: await raw.pttl(key) for key in keys}
    finally:
        await raw.aclose()


async def eventually(check: Callable[[], Awaitable[bool]], limit_s: float = 10.0) -> None:
    """Wait until `await check()` is true (an outcome; `limit_s` only ends a hang)."""
    async with asyncio.timeout(limit_s):
        while not await check():  # noqa: ASYNC110 - the server expires keys on its own
            await asyncio.sleep(0.02)


async def test_values_expire_by_the_server_and_namespaces_stay_apart(redis_db: str) -> None:
    side = await open_side_store(redis_db)
    try:
        assert isinstance(side, RedisSideStore)
        await side.put("quiet", {"ana": b"1", "b:o*[x]": b"2"}, ttl_ms=300)
        await side.put("quiet:other", {"ana": b"kept"})
        await side.put("quiet*", {"cy": b"3"})
        assert await side.get_all("quiet") == {"ana": b"1", "b:o*[x]": b"2"}
        assert await side.get_all("quiet:other") == {"ana": b"kept"}
        assert await side.get_all("quiet*") == {"cy": b"3"}
        stored = await raw_keys(redis_db)
        assert 0 < stored[b"pulse:quiet:ana"] <= 300  # the server keeps the expiry
        assert stored[b"pulse:quiet%3Aother:ana"] == -1

        async def expired() -> bool:
            return await side.get_all("quiet") == {}

        await eventually(expired)
        assert await side.get_all("quiet:other") == {"ana": b"kept"}
        await side.put("quiet:other", {"ana": b"again"}, ttl_ms=60_000)
        await side.put("quiet:other", {"ana": b"for good"})  # no ttl: the expiry is lifted
        assert (await raw_keys(redis_db))[b"pulse:quiet%3Aother:ana"] == -1
        await side.delete("quiet:other", ["ana", "never-there"])
        await side.delete("quiet*", [])
        assert await side.get_all("quiet:other") == {}
        assert await side.get_all("quiet*") == {"cy": b"3"}
    finally:
        await side.close()
    with pytest.raises(StoreClosed, match="used after close"):
        await side.get_all("quiet")


async def test_many_values_are_written_in_one_put_and_read_back_whole(redis_db: str) -> None:
    side = await open_side_store(redis_db)
    try:
        items = {f"id-{i:05d}": f"{i}".encode() for i in range(2_500)}
        await side.put("quiet", items, ttl_ms=600_000)
        other = await open_side_store(redis_db)  # another engine of the fleet
        try:
            assert await other.get_all("quiet") == items
        finally:
            await other.close()
    finally:
        await side.close()


async def test_a_read_only_redis_side_store_reads_and_never_writes(redis_db: str) -> None:
    writer = await open_side_store(redis_db)
    reader = await open_side_store(redis_db, read_only=True)
    try:
        await writer.put("quiet", {"ana": b"1"})
        assert await reader.get_all("quiet") == {"ana": b"1"}
        with pytest.raises(StoreReadOnly, match="read-only"):
            await reader.put("quiet", {"bo": b"2"})
        with pytest.raises(StoreReadOnly, match="read-only"):
            await reader.delete("quiet", ["ana"])
        assert list(await raw_keys(redis_db)) == [b"pulse:quiet:ana"]
    finally:
        await reader.close()
        await writer.close()


async def test_a_killed_server_fails_fast_naming_it_and_the_store_heals_when_it_is_back(
    redis_db: str, restore_redis: RedisServer,
) -> None:
    side = await open_side_store(f"{redis_db}?timeout=30")
    secret = redis_db.replace("redis://", "redis://pulse:s3cret-pw@")
    with_password = await open_side_store(f"{secret}?timeout=30")
    try:
        await side.put("quiet", {"ana": b"1"})
        restore_redis.kill()
        for store in (side, with_password):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as down:
                await store.get_all("quiet")
            assert time.monotonic() - started < 10  # refused: no waiting out the 30 s timeout
            message = str(down.value)
            assert f"redis://127.0.0.1:{restore_redis.port}/" in message
            assert "s3cret" not in message and "running and reachable" in message
        with pytest.raises(StoreUnavailable):
            await side.put("quiet", {"bo": b"2"})
        restore_redis.start()  # no persistence: the server is back, empty
        assert await side.get_all("quiet") == {}
        await side.put("quiet", {"bo": b"2"})
        assert await side.get_all("quiet") == {"bo": b"2"}
    finally:
        await with_password.close()
        await side.close()


async def test_a_server_that_never_answers_times_out_after_the_urls_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and says nothing
        silent.bind((LOOPBACK, 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        side = await open_side_store(f"valkey://{LOOPBACK}:{port}/0?timeout=0.2")
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match=f"valkey://127.0.0.1:{port}/0"):
                await side.get_all("quiet")
            assert time.monotonic() - started < 2.0  # 0.2 s, once more: not the default 1 s
        finally:
            await side.close()


@pytest.mark.parametrize(("url", "says"), [
    ("memcached://127.0.0.1:11211", "unknown scheme 'memcached'"),
    ("redis://", "no server named"),
    ("redis://127.0.0.1:99999/0", "port is not a number"),
    ("redis://127.0.0.1:6379/zero", "not a database number"),
    ("redis://127.0.0.1:6379/0?timout=1", "unknown option(s) timout"),
    ("redis://127.0.0.1:6379/0?timeout=-1", "timeout='-1'"),
    ("redis://127.0.0.1:6379/0?timeout=soon", "timeout='soon'"),
    ("sqlite://relative/state.db", "absolute path"),
    ("sqlite:///home/me/state.db?synchronous=OFF", "takes no options"),
])
async def test_a_side_store_url_that_cannot_be_used_says_why(url: str, says: str) -> None:
    with pytest.raises(StoreError) as refused:
        await open_side_store(url.replace("127.0.0.1", "pulse:pw-123@127.0.0.1"))
    assert says in str(refused.value)
    assert "pw-123" not in str(refused.value)


async def test_a_sqlite_side_store_url_opens_state_db_on_the_clock_given(tmp_path: Path) -> None:
    side = await open_side_store(f"sqlite://{tmp_path}/state.db", read_only=False)
    try:
        assert isinstance(side, SqliteSideStore) and side.path == tmp_path / "state.db"
        await side.put("quiet", {"ana": b"1"})
    finally:
        await side.close()


async def test_a_home_and_an_engine_keep_side_state_in_the_redis_the_url_names(
    tmp_path: Path, redis_db: str,
) -> None:
    stores = await open_home(tmp_path / "home", side_store=redis_db)
    try:
        assert isinstance(stores.side, RedisSideStore)
        await stores.side.put("quiet", {"ana": b"1"})
    finally:
        await stores.close()
    assert not (tmp_path / "home" / "state.db").exists()
    async with Engine(tmp_path / "home", side_store=redis_db) as engine:
        assert await engine.side.get_all("quiet") == {"ana": b"1"}
    reading = await open_home(tmp_path / "home", side_store=redis_db, read_only=True)
    try:
        assert await reading.side.get_all("quiet") == {"ana": b"1"}
        with pytest.raises(StoreReadOnly):
            await reading.side.put("quiet", {"bo": b"2"})
    finally:
        await reading.close()
