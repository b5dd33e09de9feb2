"""Store URLs: which backend holds a home's event log, and how to open it.

    sqlite:///absolute/path/events.db?synchronous=NORMAL&busy_timeout=5

Every place that names a store goes through `parse_store_url` (config.json, the engine, the
CLI) and `open_event_store`, so a new backend is one more scheme here and one more Recorder.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlsplit

from pulse_core._clock import Clock
from pulse_core._errors import StoreError
from pulse_core.store._base import EventStore
from pulse_core.store._events import SqliteEventStore
from pulse_core.store._objects import ObjectStore

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


class SqliteURL(NamedTuple):
    """A `sqlite://` store URL: the events.db file and its options.

    `synchronous` is SQLite's durability setting (FULL: every commit is on disk when append
    returns; NORMAL: a power cut may lose the last commits, never corrupt the file);
    `busy_timeout` (seconds) is how long a write waits for another process's lock.
    """

    scheme: str
    path: Path
    synchronous: str = "FULL"
    busy_timeout: float = 10.0

    def url(self) -> str:
        """The URL again, with every option spelled out."""
        return (f"sqlite://{quote(str(self.path))}?synchronous={self.synchronous}"
                f"&busy_timeout={self.busy_timeout:g}")


StoreURL = SqliteURL
"""Every store URL this pulse can open (a union once a second backend arrives)."""


def parse_store_url(url: str) -> StoreURL:
    """The parts of a store URL; StoreError naming the URL and the fix when it cannot be used."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        known = "sqlite:///absolute/path/events.db"
        if parts.scheme in ("postgresql", "postgres"):
            raise StoreError(f"store URL {url!r}: PostgreSQL is not supported by this pulse "
                             f"yet — use {known}")
        raise StoreError(f"store URL {url!r}: unknown scheme {parts.scheme!r} — write "
                         f"{known}")
    if parts.netloc not in ("", "localhost"):
        raise StoreError(f"store URL {url!r}: {parts.netloc!r} reads as a host; a sqlite URL "
                         "has three slashes before an absolute path: sqlite:///home/me/events.db")
    path = Path(unquote(parts.path))
    if not parts.path or not path.is_absolute() or path.name in ("", ".", ".."):
        raise StoreError(f"store URL {url!r}: give the absolute path of a file, as in "
                         "sqlite:///home/me/events.db")
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise StoreError(f"store URL {url!r}: cannot read the options {parts.query!r} — "
                         "write ?synchronous=NORMAL&busy_timeout=5") from None
    unknown = sorted(set(query) - {"synchronous", "busy_timeout"})
    if unknown:
        raise StoreError(f"store URL {url!r}: unknown option(s) {', '.join(unknown)} — a sqlite "
                         "store takes synchronous and busy_timeout")
    synchronous = query.get("synchronous", ["FULL"])[-1].upper()
    if synchronous not in _SYNCHRONOUS:
        raise StoreError(f"store URL {url!r}: synchronous={synchronous!r} — use one of "
                         f"{', '.join(_SYNCHRONOUS)}")
    raw_timeout = query.get("busy_timeout", ["10"])[-1]
    try:
        busy_timeout = float(raw_timeout)
    except ValueError:
        busy_timeout = -1.0
    if not math.isfinite(busy_timeout) or busy_timeout < 0:
        raise StoreError(f"store URL {url!r}: busy_timeout={raw_timeout!r} — give seconds, a "
                         "number >= 0")
    return SqliteURL("sqlite", path, synchronous, busy_timeout)


async def open_event_store(
    url: str | StoreURL,
    *,
    read_only: bool = False,
    clock: Clock | None = None,
    objects: ObjectStore | None = None,
) -> EventStore:
    """The EventStore over the recorder `url` names, opened (read-only: nothing written)."""
    parsed = parse_store_url(url) if isinstance(url, str) else url
    return await SqliteEventStore.open(
        parsed.path, read_only=read_only, synchronous=parsed.synchronous,
        busy_timeout=parsed.busy_timeout, clock=clock, objects=objects)
