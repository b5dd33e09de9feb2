"""A home folder: where an engine keeps its stores, and the one function that opens them.

::

    HOME/
    ├── events.db        the event log (unless config names another store URL)
    ├── vitals.db        watcher samples
    ├── state.db         the side store (unless config names a Redis/Valkey URL)
    ├── objects/         content-addressed payloads
    ├── keys.db          the memory elements' keys (never in a backup: see docs/backup.md)
    ├── checkpoints/     rebuildable caches of folds
    ├── logs/            output of processes the engine starts
    └── engine.lock      held by the engine that runs here

The engine, the CLI, the promote gate and the web UI all open a home through `open_home`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from pulse_core._clock import Clock, SystemClock
from pulse_core._errors import StoreError
from pulse_core._homelock import private_folders
from pulse_core._principals import Principal
from pulse_core._projector import refuse_lost_log
from pulse_core.store import (
    ElementKeys,
    EventStore,
    ObjectStore,
    SideStore,
    SqliteSideStore,
    SqliteVitalsStore,
    VitalsStore,
    open_event_store,
    open_side_store,
    parse_store_url,
)

__all__ = ["HomeLayout", "HomeStores", "open_home", "parse_store_url"]


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
    def keys_db(self) -> Path:
        """The memory elements' keys: destroyed by a purge, left out of backups."""
        return self.root / "keys.db"

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
        return f"sqlite://{quote(str(self.events_db.absolute()))}"


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
        """Close every store, events last; one that fails to close keeps no other open."""
        async with contextlib.AsyncExitStack() as closing:
            for store in (self.events, self.side, self.vitals):  # closed in reverse
                closing.push_async_callback(_close_quietly, store.close)


async def _close_quietly(close: Callable[[], Awaitable[None]]) -> None:
    with contextlib.suppress(StoreError):
        await close()


async def open_home(
    home: str | Path,
    *,
    store: str | None = None,
    side_store: str | None = None,
    read_only: bool = False,
    clock: Clock | None = None,
    principal: Principal | None = None,
) -> HomeStores:
    """Open the stores of `home`: the event log at `store` (a store URL; default the home's
    own events.db), vitals, the side store at `side_store` (a side-store URL, such as
    redis://host:6379/0; default the home's own state.db), objects, and the elements' keys
    (the home's keys.db, whatever the log's backend: `events.keys`). Each URL's scheme
    names the installed backend that opens it (StoreBackendMissing when none does).

    `read_only` writes and creates nothing (no folder, no file, no schema; the event log must
    exist) and never waits for a running engine's write lock; absent vitals and side state
    read as empty, and every write raises a StoreError saying the home was opened read-only.
    """
    layout = HomeLayout.at(home)
    clock = clock or SystemClock()
    url = parse_store_url(store or layout.store_url())
    if not read_only:
        # 0700 when created here; what exists keeps its mode (pulse_core._homelock)
        private_folders([layout.root, layout.objects, layout.checkpoints, layout.logs])
    objects = ObjectStore(layout.objects, read_only=read_only)
    async with contextlib.AsyncExitStack() as opening:
        events = await open_event_store(url, read_only=read_only, clock=clock, objects=objects,
                                        principal=principal)
        opening.push_async_callback(events.close)
        events.keys = ElementKeys(layout.keys_db, read_only=read_only)
        if not read_only:  # EventLogLost: checkpoints remain of a log that is now empty
            await refuse_lost_log(events, layout.checkpoints)
        vitals = await SqliteVitalsStore.open(layout.vitals_db, clock=clock, read_only=read_only)
        opening.push_async_callback(vitals.close)
        if side_store is None:
            side: SideStore = await SqliteSideStore.open(layout.side_db, clock=clock,
                                                         read_only=read_only)
        else:
            side = await open_side_store(side_store, clock=clock, read_only=read_only)
        opening.pop_all()
    return HomeStores(layout, events, vitals, side, objects, read_only)
