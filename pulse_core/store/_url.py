"""The store URLs of pulse's own event-log backends, each read by the function its scheme's
entry point names (group `pulse.stores`, see pulse_core.store._backends)::

    sqlite:///absolute/path/events.db?synchronous=NORMAL&busy_timeout=5
    postgresql://user:password@host:5432/database?schema=pulse&pool_size=4

A parsed URL is a LogLocation: it says what the backend is and opens its recorder.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from pulse_core._clock import Clock
from pulse_core._errors import StoreBackendMissing, StoreError
from pulse_core.store._recorder import Recorder
from pulse_core.store._sqlite_recorder import INLINE_COMMIT, SqliteRecorder

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


class SqliteURL(NamedTuple):
    """A `sqlite://` store URL: the events.db file and its options.

    `synchronous` is SQLite's durability setting (FULL: every commit is on disk when append
    returns; NORMAL: a power cut may lose the last commits, never corrupt the file);
    `busy_timeout` (seconds) is how long a write waits for another process's lock;
    `inline_commit` (seconds) bounds committing a lone append on the event loop's thread
    (after a commit slower than this, appends go to the writer thread; 0: always there).
    """

    scheme: str
    path: Path
    synchronous: str = "FULL"
    busy_timeout: float = 10.0
    inline_commit: float = INLINE_COMMIT

    def url(self) -> str:
        """The URL again, with every option spelled out (inline_commit when not the
        default)."""
        inline = ("" if self.inline_commit == INLINE_COMMIT
                  else f"&inline_commit={self.inline_commit:g}")
        return (f"sqlite://{quote(str(self.path))}?synchronous={self.synchronous}"
                f"&busy_timeout={self.busy_timeout:g}{inline}")

    @property
    def backend(self) -> str:
        """What messages call this backend."""
        return "SQLite"

    @property
    def file(self) -> Path:
        """The events.db file."""
        return self.path

    @property
    def spans_hosts(self) -> bool:
        """Whether engines of several hosts may share this log: no, a file is one machine's."""
        return False

    @property
    def text_holds_nul(self) -> bool:
        """Whether a text field may hold a NUL character: yes, SQLite's text takes it."""
        return True

    def display(self) -> str:
        """The URL for messages: the file, without options."""
        return f"sqlite://{self.path}"

    async def open(self, *, read_only: bool, clock: Clock | None) -> Recorder:
        """The SqliteRecorder of the file, opened (created unless `read_only`)."""
        return await SqliteRecorder.open(self.path, read_only=read_only,
                                         synchronous=self.synchronous,
                                         busy_timeout=self.busy_timeout, clock=clock,
                                         inline_commit=self.inline_commit)


class PostgresURL(NamedTuple):
    """A `postgresql://` (or `postgres://`) store URL: the database and pulse's options.

    `dsn` is what the driver connects with (libpq's own options kept, pulse's taken out,
    the password in it: the repr shows `display()` only); `host` is a host name, an address,
    a unix-socket directory (starting with /) or "" for libpq's default socket; `schema` is
    the PostgreSQL schema holding the log (several logs may share a database, one schema
    each); `pool_size` caps this process's connections to it (besides one for LISTEN and one
    per held `exclusive` lock); `connect_timeout` (seconds) bounds each connection attempt;
    `operation_timeout` (seconds) bounds every round trip on a connection (a server that
    stops answering without closing it fails the call with StoreUnavailable instead of
    holding it forever).
    """

    scheme: str
    dsn: str
    host: str
    port: int
    database: str
    schema: str = "pulse"
    pool_size: int = 4
    connect_timeout: float = 10.0
    operation_timeout: float = 30.0

    def url(self) -> str:
        """The URL again (password included), with every pulse option spelled out."""
        parts = urlsplit(self.dsn)
        query = parse_qs(parts.query, keep_blank_values=True)
        query.update(schema=[self.schema], pool_size=[str(self.pool_size)],
                     connect_timeout=[f"{self.connect_timeout:g}"],
                     operation_timeout=[f"{self.operation_timeout:g}"])
        return _postgres_url(self.scheme, parts.netloc, parts.path, query)

    @property
    def backend(self) -> str:
        """What messages call this backend."""
        return "PostgreSQL"

    @property
    def file(self) -> None:
        """The file holding the log: none of this machine, it lives in a server."""
        return None

    @property
    def spans_hosts(self) -> bool:
        """Whether engines of several hosts may share this log: yes."""
        return True

    @property
    def text_holds_nul(self) -> bool:
        """Whether a text field may hold a NUL character: no, PostgreSQL's text cannot."""
        return False

    async def open(self, *, read_only: bool, clock: Clock | None) -> Recorder:
        """The PostgresRecorder of the database, connected (the schema created unless
        `read_only`); StoreBackendMissing when psycopg is not installed."""
        try:
            from pulse_core.store._postgres import PostgresRecorder
        except ImportError as exc:
            if not (exc.name or "").startswith("psycopg"):
                raise
            raise StoreBackendMissing(
                f"store {self.display()}: the PostgreSQL driver (psycopg 3) is not installed "
                "— pip install 'upulse[postgresql]'") from exc
        return await PostgresRecorder.open(self, read_only=read_only, clock=clock)

    def display(self) -> str:
        """The URL for messages and logs: host, port, database and schema, no user name and
        no password."""
        schema = "" if self.schema == "pulse" else f"?schema={self.schema}"
        if not self.host:
            host = "(local socket)"  # libpq's default unix-socket directory
        elif self.host.startswith("/"):
            host = quote(self.host, safe="")
        else:
            host = f"[{self.host}]" if ":" in self.host else self.host
        return f"postgresql://{host}:{self.port}/{self.database}{schema}"

    def __repr__(self) -> str:
        return f"PostgresURL({self.display()!r})"


# libpq's connection options that a store URL may carry through to the driver.
_LIBPQ = frozenset({
    "host", "hostaddr", "port", "user", "password", "passfile", "application_name", "sslmode",
    "sslrootcert", "sslcert", "sslkey", "sslcrl", "sslpassword", "target_session_attrs",
    "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
    "tcp_user_timeout", "channel_binding", "gssencmode", "krbsrvname",
})
_PULSE = frozenset({"schema", "pool_size", "connect_timeout", "operation_timeout"})
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def seconds_option(raw: str, what: str, *, zero_ok: bool = False) -> float:
    """The option value `raw` as seconds; StoreError naming `what` (the URL and the option)
    unless it is a finite number > 0 (>= 0 with `zero_ok`)."""
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_ok):
        raise StoreError(f"{what}={raw!r} — give seconds, a number "
                         f"{'>= 0' if zero_ok else '> 0'}")
    return seconds


def parse_sqlite_url(url: str) -> SqliteURL:
    """The parts of a `sqlite://` store URL (the `pulse.stores` entry point of scheme
    sqlite); StoreError naming the URL and the fix when it cannot be used."""
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise StoreError(f"store URL {shown_url(url)!r}: what follows 'sqlite://' reads as a "
                         "host; a sqlite URL has three slashes before an absolute path: "
                         "sqlite:///home/me/events.db")
    path = Path(unquote(parts.path))
    if not parts.path or not path.is_absolute() or path.name in ("", ".", ".."):
        raise StoreError(f"store URL {url!r}: give the absolute path of a file, as in "
                         "sqlite:///home/me/events.db")
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise StoreError(f"store URL {url!r}: cannot read the options {parts.query!r} — "
                         "write ?synchronous=NORMAL&busy_timeout=5") from None
    unknown = sorted(set(query) - {"synchronous", "busy_timeout", "inline_commit"})
    if unknown:
        raise StoreError(f"store URL {url!r}: unknown option(s) {', '.join(unknown)} — a sqlite "
                         "store takes synchronous, busy_timeout and inline_commit")
    synchronous = query.get("synchronous", ["FULL"])[-1].upper()
    if synchronous not in _SYNCHRONOUS:
        raise StoreError(f"store URL {url!r}: synchronous={synchronous!r} — use one of "
                         f"{', '.join(_SYNCHRONOUS)}")
    busy_timeout = seconds_option(query.get("busy_timeout", ["10"])[-1],
                                  f"store URL {url!r}: busy_timeout", zero_ok=True)
    inline_commit = seconds_option(query.get("inline_commit", [str(INLINE_COMMIT)])[-1],
                                   f"store URL {url!r}: inline_commit", zero_ok=True)
    return SqliteURL("sqlite", path, synchronous, busy_timeout, inline_commit)


def shown_url(url: str) -> str:
    """`url` for an error message, its password cut out whatever characters it holds ('#',
    '?', '/' and '@' unencoded too): everything between the user name's ':' and the URL's
    last '@', and the value of a password= option."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        userinfo, _, host = rest.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        url = f"{scheme}://{user}{colon and ':***'}@{host}"
    return re.sub(r"(password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)


def _postgres_url(scheme: str, netloc: str, path: str, query: dict[str, list[str]]) -> str:
    """A postgresql URL from its parts (kept whole when the host part is empty, as for a
    unix socket named by ?host=)."""
    options = urlencode(query, doseq=True)
    return f"{scheme}://{netloc}{path}" + (f"?{options}" if options else "")


def _encoded_netloc(netloc: str) -> str:
    """`netloc` with its user name and password percent-encoded as libpq reads them: libpq
    ends the user info at the first '@' (Python at the last) and refuses a '%' that starts
    no escape, quoting the password in its error."""
    userinfo, at, hostport = netloc.rpartition("@")
    if not at:
        return netloc
    user, colon, password = userinfo.partition(":")
    return (quote(unquote(user), safe="") + colon + quote(unquote(password), safe="") + "@"
            + hostport)


def _netloc_host(netloc: str) -> str:
    """The host of a URL's `user:pw@host:port` part as written (case kept, %-escapes
    decoded, IPv6 brackets dropped); "" when it names none."""
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):
        return unquote(hostport[1:hostport.find("]")])
    return unquote(hostport.partition(":")[0])


def parse_postgres_url(url: str) -> PostgresURL:
    """The parts of a `postgresql://` (or `postgres://`) store URL (the `pulse.stores` entry
    point of those schemes); StoreError naming the URL, never its password, and the fix."""
    shown = shown_url(url)
    parts = urlsplit(url)
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        port = parts.port
    except ValueError:
        raise StoreError(f"store URL {shown!r}: cannot read its port or options — write "
                         "postgresql://user@host:5432/database?schema=pulse&pool_size=4 (a "
                         "password holding '#', '?', '/' or '@' written percent-encoded: %23, "
                         "%3F, %2F, %40)") from None
    unknown = sorted(set(query) - _LIBPQ - _PULSE)
    if unknown:
        raise StoreError(f"store URL {shown!r}: unknown option(s) {', '.join(unknown)} — a "
                         "postgresql store takes schema, pool_size, connect_timeout, "
                         "operation_timeout and "
                         "libpq's connection options (sslmode, application_name, ...)")
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise StoreError(f"store URL {shown!r}: name the database, as in "
                         "postgresql://user@host:5432/pulse")
    schema = query.pop("schema", ["pulse"])[-1]
    if not _SCHEMA.fullmatch(schema):
        raise StoreError(f"store URL {shown!r}: schema={schema!r} — use lower-case letters, "
                         "digits and _ (at most 63, not starting with a digit)")
    raw_pool = query.pop("pool_size", ["4"])[-1]
    pool_size = int(raw_pool) if raw_pool.isdigit() else 0
    if not 1 <= pool_size <= 1000:
        raise StoreError(f"store URL {shown!r}: pool_size={raw_pool!r} — give a whole number "
                         "of connections from 1 to 1000")
    timeout = seconds_option(query.pop("connect_timeout", ["10"])[-1],
                             f"store URL {shown!r}: connect_timeout")
    deadline = seconds_option(query.pop("operation_timeout", ["30"])[-1],
                              f"store URL {shown!r}: operation_timeout")
    host = query.get("host", [_netloc_host(parts.netloc)])[-1]
    raw_port = query["port"][-1] if "port" in query else str(port or 5432)
    port = int(raw_port) if raw_port.isdigit() else 0
    if not 1 <= port <= 65535:
        raise StoreError(f"store URL {shown!r}: port={raw_port!r} — give one port number, "
                         "from 1 to 65535")
    dsn = _postgres_url("postgresql", _encoded_netloc(parts.netloc), parts.path, query)
    scheme = parts.scheme
    return PostgresURL(scheme, dsn, host, port, database, schema, pool_size, timeout,
                       deadline)
