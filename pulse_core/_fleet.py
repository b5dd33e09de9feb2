"""The engines that share a log, read from it: each engine records `engine-started` as it
opens, an `engine-heartbeat` every `heartbeat_ms` while it runs (its loops and their states,
its last tick, its version and revision) and `engine-stopped` as it closes; its leases are
its claims (`effect-executing`) not yet ended.

An engine is live while its last record is younger than MISSED_BEATS heartbeats, stopped once
it recorded `engine-stopped`, and stale otherwise (killed, cut off from the store, or its
machine gone). The age is judged on the reader's clock against the record's time, so hosts'
clocks must agree to well within a heartbeat for the state to be right.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
from collections.abc import Callable, Iterable
from typing import Any, Literal

import msgspec

from pulse_core._effects import EFFECT_KINDS, EffectEntry, EffectStatus, fold_effect
from pulse_core._events import Event, EventDraft, register_kind
from pulse_core.store import EventStore

HEARTBEAT = "engine-heartbeat"
STARTED = "engine-started"
STOPPED = "engine-stopped"
FLEET_KINDS = (STARTED, HEARTBEAT, STOPPED)
MISSED_BEATS = 3
"""How many heartbeats an engine may miss before it is shown stale."""
STOPPED_KEPT = 10
"""How many stopped engines a fleet lists (the newest); live and stale ones are all listed."""
ERROR_CLIP = 200

FleetState = Literal["live", "stale", "stopped"]


class LoopBeat(msgspec.Struct, frozen=True):
    """One supervised loop as a heartbeat reports it."""

    name: str
    state: str
    restarts: int = 0
    last_error: str | None = None


class EngineHeartbeat(msgspec.Struct, frozen=True):
    """The data of `engine-heartbeat`: the engine `owner` (its executor loop's owner id) of
    `host` and process `pid` runs, as of the event's time: its loops, its last tick
    (`tick`, `last_tick_at` ms, None before its first), what it runs (`version` of upulse,
    the engine directory's `revision` when a daemon runs it), and `every_ms`, when its next
    heartbeat is due."""

    owner: str
    host: str
    pid: int
    every_ms: int
    tick: int = 0
    last_tick_at: int | None = None
    loops: list[LoopBeat] = []
    version: str = ""
    revision: str = ""


register_kind(HEARTBEAT, "a running engine says it is alive, every heartbeat_s; key: "
                         "engine@<owner>; data: owner, host, pid, every_ms, tick, "
                         "last_tick_at, loops, version, revision", EngineHeartbeat)


@functools.cache
def installed_version() -> str:
    """The installed upulse distribution's version ('' when run from a bare source tree)."""
    try:
        return importlib.metadata.version("upulse")
    except importlib.metadata.PackageNotFoundError:
        return ""


def heartbeat_draft(beat: EngineHeartbeat) -> EventDraft:
    """The `engine-heartbeat` event of `beat`."""
    return EventDraft(HEARTBEAT, f"engine@{beat.owner}", msgspec.to_builtins(beat),
                      origin="engine")


async def heartbeats(events: EventStore, beat: Callable[[], EngineHeartbeat],
                     every_s: float) -> None:
    """Record `beat()` every `every_s` seconds, until cancelled."""
    while True:
        await asyncio.sleep(every_s)
        await events.append([heartbeat_draft(beat())])


class HeldLease(msgspec.Struct, frozen=True):
    """A claim an engine holds: effect `effect_id` of `type`, its `attempt`, and the lease's
    end on the claimer's clock (`expired`: before the reader's now)."""

    effect_id: str
    type: str
    attempt: int
    lease_until: int
    expired: bool


class EngineInstance(msgspec.Struct):
    """One engine of the log as its records show it (see the module's docstring)."""

    owner: str
    host: str
    pid: int
    state: FleetState
    started_at: int
    last_seen: int
    every_ms: int
    tick: int | None = None
    last_tick_at: int | None = None
    loops: list[LoopBeat] = []
    version: str = ""
    revision: str = ""
    stopped_at: int | None = None
    leases: list[HeldLease] = []


def _owner_host(owner: str) -> str:
    parts = owner.rsplit(":", 2)
    return parts[0] if len(parts) == 3 else ""


class FleetFold:
    """The fleet as folded from the kinds it reads (FLEET_KINDS and the effect kinds), in
    log order; `instances(now)` says how each engine is at `now` (ms)."""

    kinds = tuple(sorted({*FLEET_KINDS, *EFFECT_KINDS}))

    def __init__(self) -> None:
        self._engines: dict[str, EngineInstance] = {}
        self._effects: dict[str, EffectEntry] = {}

    def fold(self, event: Event) -> None:
        """Take one event into the fleet."""
        if event.kind in EFFECT_KINDS:
            self._effect(event)
            return
        data: dict[str, Any] = event.data if isinstance(event.data, dict) else {}
        owner = data.get("owner")
        if not isinstance(owner, str) or not owner:
            return  # written by an older engine, or by hand: it names no engine
        found = self._engines.get(owner)
        if found is None:
            pid = data.get("pid")
            every = data.get("heartbeat_ms", data.get("every_ms"))
            found = self._engines[owner] = EngineInstance(
                owner, str(data.get("host") or _owner_host(owner)),
                pid if isinstance(pid, int) else 0, "live", event.ts, event.ts,
                every if isinstance(every, int) else 0)
        found.last_seen = max(found.last_seen, event.ts)
        if event.kind == STOPPED:
            found.stopped_at = event.ts
        elif event.kind == HEARTBEAT:
            try:
                beat = msgspec.convert(data, EngineHeartbeat)
            except msgspec.ValidationError:
                return
            found.every_ms, found.tick, found.last_tick_at = (beat.every_ms, beat.tick,
                                                              beat.last_tick_at)
            found.loops, found.version, found.revision = beat.loops, beat.version, beat.revision

    def _effect(self, event: Event) -> None:
        entry = fold_effect(self._effects.get(event.key), event)
        if entry is None or entry.status is EffectStatus.ACKED:
            self._effects.pop(event.key, None)  # acked is final: nothing more to hold
        else:
            self._effects[event.key] = entry

    def instances(self, now: int) -> list[EngineInstance]:
        """Every live and stale engine, and the newest STOPPED_KEPT stopped ones, newest
        start first, each with the claims it holds."""
        held: dict[str, list[HeldLease]] = {}
        for entry in self._effects.values():
            if entry.status is EffectStatus.EXECUTING and entry.owner:
                held.setdefault(entry.owner, []).append(HeldLease(
                    entry.id, entry.tag, entry.attempt, entry.lease_until,
                    entry.lease_until < now))
        shown: list[EngineInstance] = []
        stopped = 0
        # newest start first; of two started in one millisecond, the one recorded later
        newest = sorted(reversed(self._engines.values()), key=lambda e: e.started_at,
                        reverse=True)
        for found in newest:
            state = _state(found, now)
            if state == "stopped":
                stopped += 1
                if stopped > STOPPED_KEPT:
                    continue
            shown.append(msgspec.structs.replace(found, state=state,
                                                 leases=held.get(found.owner, [])))
        return shown


def _state(found: EngineInstance, now: int) -> FleetState:
    if found.stopped_at is not None:
        return "stopped"
    if found.every_ms <= 0:  # an engine that recorded no heartbeat period: nothing vouches
        return "stale"
    return "live" if now - found.last_seen <= MISSED_BEATS * found.every_ms else "stale"


async def read_fleet(store: EventStore, now: int) -> list[EngineInstance]:
    """The engines of `store`'s log as they are at `now` (ms)."""
    fleet = FleetFold()
    async for page in store.pages(0, kinds=FleetFold.kinds):
        for event in page.events:
            fleet.fold(event)
    return fleet.instances(now)


def fleet_json(instances: Iterable[EngineInstance]) -> list[dict[str, Any]]:
    """`instances` as plain data, each loop's last error clipped."""
    found: list[dict[str, Any]] = msgspec.to_builtins(list(instances))
    for engine in found:
        for loop in engine["loops"]:
            error = loop.get("last_error")
            if isinstance(error, str) and len(error) > ERROR_CLIP:
                loop["last_error"] = error[:ERROR_CLIP - 1] + "…"
    return found
