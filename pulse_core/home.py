"""A home folder: where an engine keeps its stores, and the one function that opens them.

::

    HOME/
    ├── events.db        the event log (unless config names another store URL)
    ├── vitals.db        watcher samples
    ├── state.db         the side store (quiet holds and other non-history state)
    ├── objects/         content-addressed payloads
    ├── checkpoints/     rebuildable caches of folds
    ├── logs/            output of processes the engine starts
    └── engine.lock      held by the engine that runs here

The engine, the CLI, the promote gate and the web UI all open a home through `open_home`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from pulse_core.clock import Clock, SystemClock
from pulse_core.errors import PulseError, StoreError
from pulse_core.store.base import EventStore
from pulse_core.store.objects import ObjectStore
from pulse_core.store.side import SideStore, SqliteSideStore
from pulse_core.store.vitals import VitalsStore


@dataclass(frozen=True)
class HomeLayout:
    """The names of everything pulse keeps in a home folder (one place for all of them)."""

    root: Path

    @classmethod
    def at(cls, root: str | Path) -> HomeLayout:
        """The layout of the home at `root` (`~` expanded)."""
        return cls(Path(root).expanduser())

    @property
    def events_db(self) -> Path:
        """The embedded event log."""
        return self.root / "events.db"

    @property
    def vitals_db(self) -> Path:
        """Watcher samples."""
        return self.root / "vitals.db"

    @property
    def side_db(self) -> Path:
        """The embedded side store."""
        return self.root / "state.db"

    @property
    def objects(self) -> Path:
        """Content-addressed payloads."""
        return self.root / "objects"

    @property
    def checkpoints(self) -> Path:
        """Checkpoints of projections and loops."""
        return self.root / "checkpoints"

    @property
    def logs(self) -> Path:
        """Output of processes the engine starts."""
        return self.root / "logs"

    @property
    def lock(self) -> Path:
        """The engine's exclusive lock."""
        return self.root / "engine.lock"

    def store_url(self) -> str:
        """The default store URL: the embedded SQLite log in this home."""
        return f"sqlite://{self.events_db.absolute()}"


@dataclass
class HomeStores:
    """The stores of one home, opened together and closed together."""

    layout: HomeLayout
    events: EventStore
    vitals: VitalsStore
    side: SideStore
    objects: ObjectStore
    read_only: bool

    async def close(self) -> None:
        """Close every store (events last, so pending appends finish first)."""
        for closing in (self.vitals.close, self.side.close, self.events.close):
            with contextlib.suppress(StoreError):
                await closing()


def parse_store_url(url: str) -> tuple[str, Path, dict[str, str]]:
    """(scheme, path, options) of a store URL such as `sqlite:///home/a/events.db?synchronous=
    NORMAL`; PulseError naming the URL when it cannot be used."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise PulseError(f"store URL {url!r}: unknown scheme {parts.scheme!r} — this pulse "
                         "opens sqlite:///path/to/events.db")
    if parts.netloc not in ("", "localhost") or not parts.path:
        raise PulseError(f"store URL {url!r}: write sqlite:///absolute/path/events.db")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return parts.scheme, Path(unquote(parts.path)), options


async def open_home(
    home: str | Path,
    *,
    store: str | None = None,
    read_only: bool = False,
    clock: Clock | None = None,
) -> HomeStores:
    """Open the stores of `home`: the event log at `store` (a URL; default the home's own
    events.db), vitals, the side store and objects. `read_only` opens nothing for writing and
    creates nothing; appends then raise StoreError.
    """
    from pulse_core.store.events import SqliteEventStore

    layout = HomeLayout.at(home)
    clock = clock or SystemClock()
    _, path, options = parse_store_url(store or layout.store_url())
    if not read_only:
        layout.root.mkdir(parents=True, exist_ok=True)
    objects = ObjectStore(layout.objects)
    events: EventStore
    if read_only:
        if not path.is_file():
            raise StoreError(f"{path} does not exist: there is no event log to read")
        events = SqliteEventStore(path, clock=clock, objects=objects)
    else:
        events = await SqliteEventStore.open(
            path, clock=clock, objects=objects,
            synchronous=options.get("synchronous", "FULL"))
    try:
        vitals = await VitalsStore.open(layout.vitals_db, clock=clock)
        side = await SqliteSideStore.open(layout.side_db, clock=clock, read_only=read_only)
    except BaseException:
        await events.close()
        raise
    return HomeStores(layout, events, vitals, side, objects, read_only)
