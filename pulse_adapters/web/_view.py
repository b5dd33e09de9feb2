"""The engine as the UI process sees it: the home's stores, read-only, the log's projections
folded here, and the engine's last report for what only the engine knows.

The UI runs in a process of its own (pulse_adapters.web._child), so a busy page never slows a
tick. `EngineView` offers the parts of `pulse_core.Engine` the pages read, under the same
names; an operator's control writes through `writer`, the one store it opens for writing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import msgspec

from pulse_adapters.web._pages import LayerPages, pages_of
from pulse_adapters.web._report import EngineReport
from pulse_core import (
    Clock,
    Engine,
    Event,
    EventDraft,
    LoopStatus,
    Projector,
    RuleTrace,
    Snapshot,
    SystemClock,
)
from pulse_core.store import EventStore, ObjectStore, VitalsStore

UI_PAGES = (("/", "Overview"), ("/vitals", "Vitals"), ("/events", "Events"),
            ("/effects", "Effects & tasks"), ("/rules", "Rule chain"), ("/memory", "Memory"),
            ("/fleet", "Fleet"))
"""The UI's own pages (path, title), in the nav's order; the layers' pages follow."""
RESERVED = frozenset({*(path.strip("/") for path, _ in UI_PAGES), "api", "stream", "static",
                      "pages", "metrics", "history"})
"""Slugs a layer's page may not take: the UI's own pages and routes."""


class WatcherInfo(msgspec.Struct, frozen=True):
    """A watcher of the engine, as the UI knows it: its vitals key."""

    key: str


class EngineView:
    """A running engine seen from its UI process (see the module's docstring)."""

    def __init__(self, home: Path, *, events: EventStore, writer: EventStore,
                 vitals: VitalsStore, objects: ObjectStore, placement: str,
                 clock: Clock | None = None, pages: LayerPages | None = None) -> None:
        self.home = home
        self.events = events
        self.writer = writer
        self.vitals = vitals
        self.objects = objects
        self.placement = placement
        self.clock: Clock = clock or SystemClock()
        self.report = EngineReport(placement=placement)
        #: the layers' pages, and the projections they read (folded here)
        self.pages = pages or LayerPages()
        self._projector = Projector(events, self.pages.projections())
        self._write_lock = asyncio.Lock()

    @classmethod
    def beside(cls, engine: Engine) -> EngineView:
        """A view of `engine` in its own process, through its own stores, with its layers'
        pages (for tests and for serving the UI's app in the engine's process)."""
        return cls(engine.home, events=engine.events, writer=engine.events,
                   vitals=engine.vitals, objects=engine.objects, placement=engine.placement,
                   clock=engine.clock, pages=pages_of(engine.layers, RESERVED))

    def update(self, report: EngineReport) -> None:
        """Take the engine's newest report."""
        self.report = report

    @property
    def ticks(self) -> int:
        return self.report.ticks

    @property
    def last_tick_at(self) -> int | None:
        return self.report.last_tick_at

    @property
    def last_tick_ms(self) -> int:
        return self.report.last_tick_ms

    @property
    def next_tick_at(self) -> int | None:
        return self.report.next_tick_at

    @property
    def started_at(self) -> int:
        return self.report.started_at

    @property
    def trace(self) -> list[RuleTrace]:
        """What each rule did in the engine's last tick, outermost first."""
        return list(self.report.trace)

    @property
    def rule_names(self) -> tuple[str, ...]:
        return self.report.rules

    @property
    def watchers(self) -> list[WatcherInfo]:
        """Each vitals key a watcher writes, once: two watchers of two layers may write
        one key (the model route's probes do)."""
        return [WatcherInfo(key) for key in dict.fromkeys(self.report.watchers)]

    def loops(self) -> list[LoopStatus]:
        """The engine's supervised loops, as last reported."""
        return list(self.report.loops)

    async def snapshot(self) -> Snapshot:
        """The log's projections as folded here (`state(Tasks)`, `state(Memory)`, ...); no
        vitals (read them from `vitals`)."""
        states = await self._projector.catch_up()
        return Snapshot(seq=self._projector.seq, at=self.clock.now_ms(), number=self.ticks,
                        vitals={}, projections=states)

    @contextlib.asynccontextmanager
    async def writable(self) -> AsyncIterator[EventStore]:
        """The event log for writing, for one operator's control at a time."""
        async with self._write_lock:
            yield self.writer

    async def append(self, drafts: Sequence[EventDraft]) -> list[Event]:
        """Append `drafts` (see `writable`)."""
        async with self.writable() as store:
            return list((await store.append(list(drafts))).events)
