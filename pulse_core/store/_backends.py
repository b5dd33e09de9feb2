"""Store backends as plug-ins: a URL's scheme names the backend, an entry point provides it.

A distribution declares, for each URL scheme it serves, a function that reads such a URL::

    [project.entry-points."pulse.stores"]        # event logs: url -> LogLocation
    sqlite = "pulse_core.store._url:parse_sqlite_url"
    postgresql = "pulse_core.store._url:parse_postgres_url"

    [project.entry-points."pulse.side_stores"]   # side stores: url -> SideLocation
    redis = "pulse_core.store._redis:parse_redis_url"

The function checks the URL without connecting and returns a location that opens the store.
pulse's own backends are registered the same way as anyone else's, so nothing here knows a
backend by name; a backend's driver is imported only when one of its stores is opened.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

from pulse_core._clock import Clock
from pulse_core._errors import StoreBackendMissing, StoreError
from pulse_core._principals import Principal
from pulse_core.store._base import EventStore
from pulse_core.store._objects import ObjectStore
from pulse_core.store._recorder import Recorder
from pulse_core.store._side import SideStore
from pulse_core.store._url import shown_url

STORES_GROUP = "pulse.stores"
"""Entry points naming, by URL scheme, the function that reads an event-log URL."""
SIDE_STORES_GROUP = "pulse.side_stores"
"""Entry points naming, by URL scheme, the function that reads a side-store URL."""

@runtime_checkable
class LogLocation(Protocol):
    """Where one backend keeps an event log: a store URL, read and checked, not yet opened."""

    @property
    def backend(self) -> str:
        """What messages call the backend ("SQLite", "PostgreSQL")."""
        ...

    @property
    def file(self) -> Path | None:
        """The one file of this machine that holds the log; None when it lives elsewhere (a
        server, memory)."""
        ...

    @property
    def spans_hosts(self) -> bool:
        """Whether engines of several hosts may share this log."""
        ...

    @property
    def text_holds_nul(self) -> bool:
        """Whether a text field (kind, key, origin, ids) may hold a NUL character here."""
        ...

    def display(self) -> str:
        """The location for messages and logs: never a password."""
        ...

    async def open(self, *, read_only: bool, clock: Clock | None) -> Recorder:
        """The log's recorder, opened (read-only: nothing created or written); StoreError
        when it cannot be (StoreBackendMissing when the driver is not installed)."""
        ...


@runtime_checkable
class SideLocation(Protocol):
    """Where one backend keeps a side store: a side-store URL, read and checked."""

    @property
    def file(self) -> Path | None:
        """The one file of this machine that holds the side store, else None."""
        ...

    def display(self) -> str:
        """The location for messages and logs: never a password."""
        ...

    async def open(self, *, read_only: bool, clock: Clock | None) -> SideStore:
        """The side store, opened (read-only: nothing written)."""
        ...


def store_schemes() -> list[str]:
    """The event-log URL schemes the installed backends serve."""
    return sorted({ep.name for ep in entry_points(group=STORES_GROUP)})


def side_store_schemes() -> list[str]:
    """The side-store URL schemes the installed backends serve."""
    return sorted({ep.name for ep in entry_points(group=SIDE_STORES_GROUP)})


def parse_store_url(url: str) -> LogLocation:
    """The event log `url` names, read by the backend its scheme names (not opened);
    StoreBackendMissing when no backend serves the scheme, StoreError naming the URL and
    the fix when the backend cannot use it."""
    location, ep = _parse(url, STORES_GROUP, "store URL")
    if not isinstance(location, LogLocation):
        raise _not_a("LogLocation", location, ep)
    return location


def parse_side_store_url(url: str) -> SideLocation:
    """The side store `url` names, read by the backend its scheme names (not opened);
    errors as for parse_store_url."""
    location, ep = _parse(url, SIDE_STORES_GROUP, "side-store URL")
    if not isinstance(location, SideLocation):
        raise _not_a("SideLocation", location, ep)
    return location


async def open_event_store(
    url: str | LogLocation,
    *,
    read_only: bool = False,
    clock: Clock | None = None,
    objects: ObjectStore | None = None,
    principal: Principal | None = None,
) -> EventStore:
    """The EventStore over the recorder `url` names, opened (read-only: nothing written),
    held by `principal` (default: a person, through the library)."""
    location = parse_store_url(url) if isinstance(url, str) else url
    recorder = await location.open(read_only=read_only, clock=clock)
    return EventStore(recorder, objects=objects, principal=principal)


async def open_side_store(url: str, *, clock: Clock | None = None,
                          read_only: bool = False) -> SideStore:
    """The side store `url` names (such as sqlite:///home/me/.upulse/state.db or
    redis://127.0.0.1:6379/0), opened; StoreError names a URL that cannot be used (its
    password cut) and the fix."""
    return await parse_side_store_url(url).open(read_only=read_only, clock=clock)


def _parse(url: str, group: str, what: str) -> tuple[object, EntryPoint]:
    """What the backend registered for `url`'s scheme in `group` reads from it, and its
    entry point."""
    scheme = urlsplit(url).scheme
    found = [ep for ep in entry_points(group=group) if ep.name == scheme]
    if not found:
        installed = sorted({ep.name for ep in entry_points(group=group)})
        known = ", ".join(f"{name}://" for name in installed) or "none — reinstall upulse"
        named = f"unknown scheme {scheme!r}"
        raise StoreBackendMissing(
            f"{what} {shown_url(url)!r}: {named}, no installed store backend serves it "
            f"(installed: {known}) — fix the URL, or install the distribution that provides "
            f"a backend for it (it registers itself in entry-point group {group!r})")
    if len({ep.value for ep in found}) > 1:
        raise StoreBackendMissing(
            f"{what} scheme {scheme!r} is served by several backends "
            f"({', '.join(ep.value for ep in found)}) — uninstall all but one")
    return _reader(found[0], group)(url), found[0]


def _not_a(kind: str, location: object, ep: EntryPoint) -> StoreError:
    return StoreError(f"store backend {ep.name!r} ({ep.value}) returned "
                      f"{type(location).__name__}, not a {kind} — fix or reinstall the "
                      "distribution that provides it")


def _reader(ep: EntryPoint, group: str) -> Callable[[str], object]:
    """The URL-reading function entry point `ep` names; StoreBackendMissing when it cannot
    be imported (a missing driver, a broken install)."""
    try:
        reader = ep.load()
    except ImportError as exc:
        dist = ep.dist.name if ep.dist is not None else "the distribution that provides it"
        raise StoreBackendMissing(
            f"store backend {ep.name!r} ({ep.value}, group {group!r}) cannot be imported: "
            f"{exc} — install what it needs (pip install '{dist}')") from exc
    if not callable(reader):
        raise StoreError(f"store backend {ep.name!r} ({ep.value}) is a "
                         f"{type(reader).__name__}, not a function reading a URL")
    return reader  # type: ignore[no-any-return]
