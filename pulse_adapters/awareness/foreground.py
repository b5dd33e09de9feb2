"""Foreground work on a shared model route, held per holder, recorded as events.

A holder (an agent session, a turn in progress) begins foreground work and ends it; while
any holder holds, reviews that share the agent's model route wait, and one already streaming
is preempted. A hold lapses `lapse_ms` after it began, so a holder that crashed mid-turn
blocks reviews for that long at most. Every begin and end is an event
(`foreground-began`, `foreground-ended`, key `foreground:<holder>`), written by whoever holds:
this engine through `Foreground.begin`/`.end`, or another process sharing the home (the
Hermes plugin in Hermes' process), whose events the layer's ForegroundFollower applies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable

import msgspec

from pulse_core import (
    Clock,
    Engine,
    Event,
    EventDraft,
    EventStore,
    LayerError,
    StoreError,
    SystemClock,
    register_kind,
)

log = logging.getLogger("pulse.awareness")

FOREGROUND_BEGAN = "foreground-began"
FOREGROUND_ENDED = "foreground-ended"
KINDS = (FOREGROUND_BEGAN, FOREGROUND_ENDED)
LAPSE_S = 600.0
"""How long a hold lasts when its holder never ends it (a crashed turn), by default."""


class ForegroundBegan(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`holder` began foreground work; the hold lapses `lapse_ms` later unless ended.
    `by` names the writer's Foreground instance (its own events it has applied already)."""

    holder: str
    lapse_ms: int
    by: str = ""


class ForegroundEnded(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`holder` ended its foreground work, or (`lapsed`) its hold ran out unended."""

    holder: str
    lapsed: bool = False
    by: str = ""


register_kind(FOREGROUND_BEGAN, "foreground work began on the agent's model route; key: "
                                "foreground:<holder>; data: holder, lapse_ms, by",
              ForegroundBegan)
register_kind(FOREGROUND_ENDED, "foreground work ended (or its hold lapsed); key: "
                                "foreground:<holder>; data: holder, lapsed, by",
              ForegroundEnded)


def foreground_key(holder: str) -> str:
    """The event key of `holder`'s foreground work."""
    return f"foreground:{holder}"


def foreground_began(holder: str, lapse_s: float = LAPSE_S, *, origin: str = "agent",
                     by: str = "") -> EventDraft:
    """The `foreground-began` draft a process sharing the home appends when `holder`'s
    foreground work begins (an agent turn about to ask the model)."""
    data = ForegroundBegan(holder, int(lapse_s * 1000), by)
    return EventDraft(FOREGROUND_BEGAN, foreground_key(holder), msgspec.to_builtins(data),
                      origin=origin)


def foreground_ended(holder: str, *, lapsed: bool = False, origin: str = "agent",
                     by: str = "") -> EventDraft:
    """The `foreground-ended` draft for `holder` (`lapsed`: its hold ran out unended)."""
    data = ForegroundEnded(holder, lapsed, by)
    return EventDraft(FOREGROUND_ENDED, foreground_key(holder), msgspec.to_builtins(data),
                      origin=origin)


class NoAwarenessLayer(LayerError):
    """The engine runs no awareness layer, so there is no foreground to bracket: add
    `"awareness"` to config.json's layers (or pass the layer to Engine)."""


class Foreground:
    """Who holds the foreground now; `active` is set while anyone does.

    `begin(holder)` / `end(holder)` bracket one holder's foreground work (any number at a
    time); bound to an engine's log, each is recorded as an event. A hold not ended lapses
    after its lapse (`lapse_s`, default the Foreground's), recorded as `foreground-ended`
    with `lapsed` true. Call it on the engine's event loop; another thread or process
    appends `foreground_began` / `foreground_ended` drafts to the log instead.
    """

    ORIGIN = "rule:awareness"

    def __init__(self, *, lapse_s: float = LAPSE_S, clock: Clock | None = None) -> None:
        self.lapse_s = lapse_s
        self.clock = clock or SystemClock()
        self.active = asyncio.Event()
        self._free = asyncio.Event()
        self._free.set()
        self._holders: dict[str, float] = {}  # holder -> lapses at (time.monotonic())
        self._events: EventStore | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._writes: set[asyncio.Task[None]] = set()
        self.me = os.urandom(6).hex()

    @property
    def holders(self) -> tuple[str, ...]:
        """The holders holding now, sorted."""
        return tuple(sorted(self._holders))

    def bind(self, events: EventStore | None) -> None:
        """Record every begin, end and lapse in `events` from now on (None: stop)."""
        self._events = events

    def begin(self, holder: str = "local", lapse_s: float | None = None) -> None:
        """`holder`'s foreground work started: reviews on a shared route wait, and one in
        flight is preempted, until it ends or lapses."""
        lapse = self.lapse_s if lapse_s is None else lapse_s
        self._hold(holder, lapse)
        self._record(foreground_began(holder, lapse, origin=self.ORIGIN, by=self.me))

    def end(self, holder: str = "local") -> None:
        """`holder`'s foreground work finished."""
        if self._holders.pop(holder, None) is not None:
            self._record(foreground_ended(holder, origin=self.ORIGIN, by=self.me))
        self._update()

    def apply(self, event: Event, *, live: bool = True) -> None:
        """Apply a foreground event another writer recorded (its own are applied already).
        A `live` one (just committed) holds for its whole lapse from now; one read from
        history holds what is left of its lapse by its time, nothing once that passed."""
        data = event.data if isinstance(event.data, dict) else {}
        holder = data.get("holder")
        if not isinstance(holder, str) or data.get("by") == self.me:
            return
        if event.kind == FOREGROUND_BEGAN:
            lapse_ms = data.get("lapse_ms")
            if not isinstance(lapse_ms, int):
                return
            left_s = (lapse_ms if live else event.ts + lapse_ms - self.clock.now_ms()) / 1000
            if left_s > 0:
                self._hold(holder, left_s)
        elif event.kind == FOREGROUND_ENDED:
            self._holders.pop(holder, None)
            self._update()

    async def wait_free(self, timeout_s: float) -> bool:
        """Wait until no holder holds, at most `timeout_s`; whether it is free."""
        if self._free.is_set():
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await self._free.wait()
        except TimeoutError:
            return False
        return True

    async def drain(self) -> None:
        """Finish recording the events in flight."""
        while self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    def _hold(self, holder: str, lapse_s: float) -> None:
        self._holders[holder] = time.monotonic() + lapse_s
        self._update()

    def _update(self) -> None:
        now = time.monotonic()
        for holder, until in list(self._holders.items()):
            if until <= now:
                del self._holders[holder]
                self._record(foreground_ended(holder, lapsed=True, origin=self.ORIGIN,
                                              by=self.me))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._holders:
            self.active.set()
            self._free.clear()
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop: lapses are applied at the next begin, end or apply
            self._timer = loop.call_later(min(self._holders.values()) - now + 0.001,
                                          self._update)
        else:
            self.active.clear()
            self._free.set()

    def _record(self, draft: EventDraft) -> None:
        events = self._events
        if events is None:
            return
        try:
            task = asyncio.get_running_loop().create_task(self._write(events, draft))
        except RuntimeError:
            return
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    @staticmethod
    async def _write(events: EventStore, draft: EventDraft) -> None:
        try:
            await events.append([draft])
        except StoreError as exc:  # the hold itself is in memory: only its record is lost
            log.warning("pulse: awareness: cannot record %s for %s: %s", draft.kind,
                        draft.key, exc)


class ForegroundFollower:
    """The layer's service: binds the Foreground to the engine's log, applies the holds
    still running when the engine starts, then every foreground event as it commits
    (another process's within `poll_s`)."""

    name = "awareness-foreground"
    RECENT = 500

    def __init__(self, foreground: Foreground, *, poll_s: float = 0.25) -> None:
        self.foreground = foreground
        self.poll_s = poll_s

    async def __call__(self, engine: Engine) -> None:
        events = engine.events
        self.foreground.clock = engine.clock
        self.foreground.bind(events)
        try:
            head = await events.last_seq()
            recent = await events.read(kinds=KINDS, limit=self.RECENT, newest_first=True)
            self._apply(reversed(recent))
            async for event in events.changes(head, kinds=KINDS, poll_interval=self.poll_s):
                self.foreground.apply(event)
        finally:
            await self.foreground.drain()
            self.foreground.bind(None)

    def _apply(self, found: Iterable[Event]) -> None:
        for event in found:
            self.foreground.apply(event, live=False)


def foreground_of(engine: Engine) -> Foreground:
    """The Foreground of `engine`'s awareness layer; NoAwarenessLayer when it runs none."""
    for layer in engine.layers:
        for service in layer.services:
            if isinstance(service, ForegroundFollower):
                return service.foreground
    raise NoAwarenessLayer(
        "this engine runs no awareness layer, so it has no foreground to bracket: add "
        '"awareness" to config.json\'s layers (with its base_url and model), or pass '
        "build_reviewer(...).layer to Engine(layers=[...])")
