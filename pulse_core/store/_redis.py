"""The side store in Redis or Valkey: one key per namespace and key, expiring by the server.

    redis://[user:password@]host[:port][/db][?timeout=1]     (rediss:// with TLS)
    valkey://[user:password@]host[:port][/db][?timeout=1]    (valkeys:// with TLS)

Each value is one string key `pulse:<namespace>:<key>` (the namespace %-encoded, so it holds
no `:`), set with `PX` when it has a time to live, so the server expires it; one Redis
database per event log keeps fleets apart. The `redis` package is imported only when a store
opens, and every failure to reach the server (refused, reset, timed out after `timeout`
seconds) raises StoreUnavailable naming the server, never its password.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar
from urllib.parse import parse_qs, quote, unquote, urlsplit

from pulse_core._clock import Clock
from pulse_core._errors import (
    StoreBackendMissing,
    StoreClosed,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
)
from pulse_core._redact import redact_urls
from pulse_core.store._url import seconds_option

if TYPE_CHECKING:
    from redis.asyncio import Redis

T = TypeVar("T")

SCHEMES = {"redis": False, "rediss": True, "valkey": False, "valkeys": True}
"""Side-store URL schemes served by RedisSideStore, and whether each speaks TLS."""

PREFIX = "pulse:"
"""What every key pulse writes in a Redis database begins with."""

_BATCH = 1_000
"""Keys asked for by one SCAN step, one MGET or one DEL."""


class RedisURL(NamedTuple):
    """A Redis or Valkey side-store URL: the server, the database and the timeout (seconds)
    of connecting and of each command."""

    scheme: str
    host: str
    port: int = 6379
    db: int = 0
    username: str | None = None
    password: str | None = None
    timeout: float = 1.0

    @property
    def tls(self) -> bool:
        """Whether the connection speaks TLS (rediss://, valkeys://)."""
        return SCHEMES[self.scheme]

    def name(self) -> str:
        """The server and database, without user name or password: what errors show."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}/{self.db}"

    @property
    def file(self) -> None:
        """The file holding the side store: none of this machine, it lives in a server."""
        return None

    def display(self) -> str:
        """The server and database, for messages (as `name`)."""
        return self.name()

    def __repr__(self) -> str:
        return f"RedisURL({self.name()!r})"

    async def open(self, *, read_only: bool, clock: Clock | None) -> RedisSideStore:
        """The RedisSideStore of this database (expiring by the server's clock, not
        `clock`)."""
        return await RedisSideStore.open(self, read_only=read_only)


def parse_redis_url(url: str) -> RedisURL:
    """The parts of a redis://, rediss://, valkey:// or valkeys:// URL (the `pulse.side_stores`
    entry point of those schemes); StoreError naming the URL (its password cut) and the fix
    when it cannot be used."""
    shown = redact_urls(url)
    parts = urlsplit(url)
    example = f"{parts.scheme or 'redis'}://127.0.0.1:6379/0"
    if parts.scheme not in SCHEMES:
        raise StoreError(f"side-store URL {shown!r}: scheme {parts.scheme!r} is not Redis — "
                         f"write {example}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise StoreError(f"side-store URL {shown!r}: the port is not a number from 1 to 65535 "
                         f"— write {example}") from None
    if not host:
        raise StoreError(f"side-store URL {shown!r}: no server named — write {example}")
    path = parts.path.strip("/")
    if not path:
        db = 0
    elif path.isdigit():
        db = int(path)
    else:
        raise StoreError(f"side-store URL {shown!r}: {parts.path!r} is not a database number "
                         f"— write {example}")
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise StoreError(f"side-store URL {shown!r}: cannot read the options — write "
                         "?timeout=1") from None
    unknown = sorted(set(query) - {"timeout"})
    if unknown:
        raise StoreError(f"side-store URL {shown!r}: unknown option(s) {', '.join(unknown)} — "
                         "a Redis side store takes timeout (seconds)")
    timeout = seconds_option(query.get("timeout", ["1"])[-1],
                             f"side-store URL {shown!r}: timeout")
    return RedisURL(parts.scheme, host, port or 6379, db,
                    unquote(parts.username) if parts.username else None,
                    unquote(parts.password) if parts.password is not None else None, timeout)


def _glob_escaped(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


class RedisSideStore:
    """The SideStore protocol over one Redis (or Valkey) database.

    Expiry is the server's (its clock, real milliseconds), not the engine's clock. Read-only,
    every write raises StoreReadOnly and nothing is sent but reads. Opening connects nobody:
    a server that is down shows at the first read or write, as StoreUnavailable.
    """

    def __init__(self, url: RedisURL, client: Redis, read_only: bool = False) -> None:
        self.url = url
        self.read_only = read_only
        self._client: Redis | None = client

    @classmethod
    async def open(cls, url: str | RedisURL, *, read_only: bool = False) -> RedisSideStore:
        """The side store in the database `url` names (the connection is made at first use)."""
        parsed = parse_redis_url(url) if isinstance(url, str) else url
        try:
            from redis.asyncio import Redis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff
        except ImportError:
            raise StoreBackendMissing(f"side store {parsed.name()}: the `redis` package is "
                                      "not installed — pip install 'upulse[redis]'"
                                      ) from None
        client = Redis(host=parsed.host, port=parsed.port, db=parsed.db,
                       username=parsed.username, password=parsed.password, ssl=parsed.tls,
                       socket_timeout=parsed.timeout, socket_connect_timeout=parsed.timeout,
                       retry=Retry(NoBackoff(), 1),  # once at once: a pooled link the
                       client_name="pulse")          # server dropped is dialled again
        return cls(parsed, client, read_only)

    def _prefix(self, namespace: str) -> str:
        return f"{PREFIX}{quote(namespace, safe='')}:"

    async def _call(self, doing: str, work: Callable[[Redis], Awaitable[T]]) -> T:
        """`work` on the client, every failure turned into the StoreError that says what to
        do."""
        from redis import exceptions

        if self._client is None:
            raise StoreClosed(f"side store {self.url.name()}: used after close")
        try:
            return await work(self._client)
        except exceptions.AuthenticationError as exc:
            raise StoreError(self._problem(doing, exc, "check the user name and password in "
                                                       "the side-store URL")) from None
        except (exceptions.ConnectionError, exceptions.TimeoutError, OSError) as exc:
            raise StoreUnavailable(self._problem(
                doing, exc, "is the Redis/Valkey server running and reachable from this host? "
                "Nothing was lost: try again once it answers")) from None
        except exceptions.RedisError as exc:
            raise StoreError(self._problem(doing, exc, "check the server's log and that this "
                                                       "database is pulse's alone")) from None

    def _problem(self, doing: str, exc: BaseException, fix: str) -> str:
        return (f"side store {self.url.name()}: cannot {doing}: {type(exc).__name__}: "
                f"{redact_urls(str(exc))} — {fix}")

    def _refuse_if_read_only(self) -> None:
        if self.read_only:
            raise StoreReadOnly(f"side store {self.url.name()}: opened read-only, so side "
                                "state cannot be written — open the home without read_only")

    async def get_all(self, namespace: str) -> dict[str, bytes]:
        """Every live value in `namespace`, by key (SCAN, then MGET in batches)."""
        prefix = self._prefix(namespace)

        async def work(client: Redis) -> dict[str, bytes]:
            keys: set[bytes] = set()
            async for key in client.scan_iter(match=f"{_glob_escaped(prefix)}*",
                                              count=_BATCH):
                keys.add(key)
            found: dict[str, bytes] = {}
            names = sorted(keys)
            for start in range(0, len(names), _BATCH):
                chunk = names[start:start + _BATCH]
                values: list[Any] = await client.mget(chunk)
                for name, value in zip(chunk, values, strict=True):
                    if value is not None:  # expired between the scan and the read
                        found[name.decode()[len(prefix):]] = bytes(value)
            return found

        return await self._call(f"read namespace {namespace!r}", work)

    async def put(self, namespace: str, items: Mapping[str, bytes],
                  ttl_ms: int | None = None) -> None:
        """Set `items` in one MULTI/EXEC; with `ttl_ms` the server expires them."""
        self._refuse_if_read_only()
        if not items:
            return
        prefix = self._prefix(namespace)

        async def work(client: Redis) -> None:
            async with client.pipeline(transaction=True) as pipe:
                for key, value in items.items():
                    pipe.set(f"{prefix}{key}", bytes(value), px=ttl_ms)
                await pipe.execute()

        await self._call(f"write namespace {namespace!r}", work)

    async def delete(self, namespace: str, keys: Iterable[str]) -> None:
        """Remove `keys` (absent ones are ignored)."""
        self._refuse_if_read_only()
        prefix = self._prefix(namespace)
        names = [f"{prefix}{key}" for key in keys]
        if not names:
            return

        async def work(client: Redis) -> None:
            for start in range(0, len(names), _BATCH):
                await client.delete(*names[start:start + _BATCH])

        await self._call(f"delete from namespace {namespace!r}", work)

    async def close(self) -> None:
        """Close the connections; later calls raise StoreClosed."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
