"""Schedules: named rhythms whose next due time is folded from the log, so they survive
restarts and two engines sharing a log fire each due time once.

Three rhythms:

- `Every(name, min_s, max_s)`: every min_s to max_s seconds after the last fire; the jitter is
  derived from the name and the fire count (a hash), so a restart never re-rolls it.
- `DailyAt(name, "03:00", tz="Europe/Lisbon")`: at that local wall time each day (zoneinfo,
  DST-correct).
- `AfterEvents(name, n, kinds=None)`: once n events (of those kinds; None: every kind) were
  committed after the last fire.

A fire is a `schedule-fired` event on `schedule:<name>`, appended with the key's expected
version and the idempotency key `schedule:<name>:<due_at>`. A schedule that never fired
counts from the log's first event, the home's birth: `Every` is due then (or `first_after_s`
later), `DailyAt` at the first slot at or after it, `AfterEvents` counts from the start. A
schedule added to an older home is therefore due at once, then keeps its rhythm.

A forged or mistaken fire cannot stop a schedule: the fold takes `fired_at` and `due_at` as at
most the event's own ts (a fire "from 2**62" counts as a fire now), the payload refuses times
outside 0..MAX_MS and seqs outside 0..MAX_SEQ, and only the origins that run schedules
(FIRE_ORIGINS: engine, executor, rule, survival, cli) record fires: a `schedule-fired` written
by an agent, a human or a watcher is ignored, so it cannot postpone one either.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Iterable
from typing import Any, overload
from zoneinfo import ZoneInfo

import msgspec

from pulse_core._errors import IdempotencyConflict, InvalidEvent, VersionConflict
from pulse_core._events import MAX_SEQ, Event, EventDraft, register_kind
from pulse_core._pmap import PersistentMap
from pulse_core._snapshot import Projection
from pulse_core.store import EventStore

FIRED = "schedule-fired"
_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")
MAX_MS = 253_402_300_799_999
"""The latest time (ms since the epoch) a payload may name: 9999-12-31T23:59:59.999Z."""
FIRE_ORIGINS = ("engine", "executor", "rule", "survival", "cli")
"""The origins (with any `:suffix`) whose schedule-fired events count as fires."""


def check_ms(value: int, what: str) -> int:
    """`value` when it is a time in 0..MAX_MS; ValueError naming `what` otherwise."""
    if not 0 <= value <= MAX_MS:
        raise ValueError(f"{what} {value} is not a time in ms since the epoch (0..{MAX_MS})")
    return value


def fires_from(origin: str) -> bool:
    """Whether a schedule-fired written by `origin` counts (see FIRE_ORIGINS)."""
    return origin.split(":", 1)[0] in FIRE_ORIGINS


class Every(msgspec.Struct, frozen=True):
    """Due min_s..max_s seconds after the last fire (jitter fixed per name and fire count);
    never fired: due at the log's start plus `first_after_s` (0 when None)."""

    name: str
    min_s: float
    max_s: float
    first_after_s: float | None = None

    def __post_init__(self) -> None:
        _check_name(self.name)
        if not 0 < self.min_s <= self.max_s:
            raise ValueError(f"schedule {self.name!r}: need 0 < min_s <= max_s, got "
                             f"{self.min_s} and {self.max_s}")
        if self.first_after_s is not None and self.first_after_s < 0:
            raise ValueError(f"schedule {self.name!r}: first_after_s must be >= 0")


class DailyAt(msgspec.Struct, frozen=True):
    """Due each day at local wall time `at` ("HH:MM") in time zone `tz`."""

    name: str
    at: str
    tz: str = "UTC"

    def __post_init__(self) -> None:
        _check_name(self.name)
        if not _HHMM.match(self.at):
            raise ValueError(f"schedule {self.name!r}: at={self.at!r} is not HH:MM (24 h)")
        ZoneInfo(self.tz)  # ZoneInfoNotFoundError names an unknown zone


class AfterEvents(msgspec.Struct, frozen=True):
    """Due once `n` events of `kinds` (None: any kind but schedule-fired) were committed
    after the last fire."""

    name: str
    n: int
    kinds: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.n < 1:
            raise ValueError(f"schedule {self.name!r}: n must be >= 1, not {self.n}")


Schedule = Every | DailyAt | AfterEvents


def _check_name(name: str) -> None:
    if not name or name != name.strip() or any(c.isspace() for c in name):
        raise ValueError(f"schedule name {name!r} must be non-empty, without whitespace")


class ScheduleFired(msgspec.Struct, frozen=True):
    """Payload of schedule-fired: the due time fired, when, and the log head then."""

    due_at: int
    fired_at: int
    seq: int

    def __post_init__(self) -> None:
        check_ms(self.due_at, "due_at")
        check_ms(self.fired_at, "fired_at")
        if not 0 <= self.seq <= MAX_SEQ:
            raise ValueError(f"seq {self.seq} is not a seq (0..{MAX_SEQ})")


register_kind(FIRED, "a schedule fired (due_at, fired_at ms; seq: the log head then); key: "
              "schedule:<name>", ScheduleFired)


class LastFire(msgspec.Struct, frozen=True, gc=False):
    """A schedule's latest fire: `count` fires so far, `event_seq` the fire's own seq;
    `total_at`/`counts_at` are the event counts (all, per kind) at that point."""

    due_at: int
    fired_at: int
    seq: int
    count: int
    event_seq: int
    total_at: int = 0
    counts_at: dict[str, int] = {}


class SchedulesState(msgspec.Struct, frozen=True):
    """Last fire per schedule name, event counts (all, per kind; schedule-fired left out),
    and the ts of the log's first event (`start_ms`, None for an empty log)."""

    fires: PersistentMap[str, LastFire] = msgspec.field(default_factory=PersistentMap)
    counts: PersistentMap[str, int] = msgspec.field(default_factory=PersistentMap)
    total: int = 0
    start_ms: int | None = None


def schedule_key(name: str) -> str:
    """The event key of schedule `name`."""
    return f"schedule:{name}"


def _last_fire(event: Event, total: int = 0, counts: dict[str, int] | None = None
               ) -> LastFire:
    """The fire `event` records, its times clamped to the event's ts (never in the future of
    its own commit), its log head to the event's seq."""
    body = event.payload(ScheduleFired)
    return LastFire(min(body.due_at, event.ts), min(body.fired_at, event.ts),
                    min(body.seq, event.seq), event.version, event.seq, total, counts or {})


class Schedules(Projection[SchedulesState]):
    """The last fire of every schedule, and the counts AfterEvents needs (sees every event)."""

    name = "schedules"
    kinds = None
    version = 2  # 2: fired_at/due_at clamped to the ts; fires only from FIRE_ORIGINS

    def initial(self) -> SchedulesState:
        return SchedulesState()

    def apply(self, state: SchedulesState, event: Event) -> SchedulesState:
        start = event.ts if state.start_ms is None else state.start_ms
        if event.kind == FIRED:
            if not event.key.startswith("schedule:") or not fires_from(event.origin):
                return state
            fire = _last_fire(event, state.total, dict(state.counts.items()))
            return SchedulesState(state.fires.set(event.key.removeprefix("schedule:"), fire),
                                  state.counts, state.total, start)
        counts = state.counts.set(event.kind, state.counts.get(event.kind, 0) + 1)
        return SchedulesState(state.fires, counts, state.total + 1, start)


def jitter_ms(schedule: Every, count: int) -> int:
    """The interval after fire number `count`: in [min_s, max_s] seconds, fixed by a hash of
    the name and the count, so every engine and every restart computes the same one."""
    digest = hashlib.sha256(f"{schedule.name}:{count}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    low, high = round(schedule.min_s * 1000), round(schedule.max_s * 1000)
    return low + int(fraction * (high - low))


def _slot(schedule: DailyAt, after_ms: int, *, inclusive: bool) -> int:
    """The first daily slot at (inclusive) or after `after_ms`. A wall time that does not
    exist that day (the spring-forward gap) falls at the same offset past the jump; one that
    happens twice (fall back) fires at its first occurrence."""
    zone = ZoneInfo(schedule.tz)
    hour, minute = (int(part) for part in schedule.at.split(":"))
    day = dt.datetime.fromtimestamp(after_ms / 1000, zone).date() - dt.timedelta(days=1)
    for _ in range(4):
        local = dt.datetime.combine(day, dt.time(hour, minute), zone)
        at = int(local.timestamp() * 1000)
        if at > after_ms or (inclusive and at == after_ms):
            return at
        day += dt.timedelta(days=1)
    raise AssertionError("a daily slot always exists within three days")  # pragma: no cover


def _time_due(schedule: Every | DailyAt, last: LastFire | None, start_ms: int) -> int:
    if isinstance(schedule, Every):
        if last is None:
            return start_ms + round((schedule.first_after_s or 0) * 1000)
        return last.fired_at + jitter_ms(schedule, last.count)
    if last is None:
        return _slot(schedule, start_ms, inclusive=True)
    return _slot(schedule, last.fired_at, inclusive=False)


def events_since(schedule: AfterEvents, state: SchedulesState) -> int:
    """How many matching events were committed since the schedule's last fire."""
    last = state.fires.get(schedule.name)
    if schedule.kinds is None:
        return state.total - (last.total_at if last else 0)
    then = last.counts_at if last else {}
    return sum(state.counts.get(k, 0) - then.get(k, 0) for k in set(schedule.kinds))


@overload
def next_due(schedule: Every | DailyAt, state: SchedulesState, now_ms: int) -> int: ...


@overload
def next_due(schedule: Schedule, state: SchedulesState, now_ms: int) -> int | None: ...


def next_due(schedule: Schedule, state: SchedulesState, now_ms: int) -> int | None:
    """When `schedule` is due next (ms since the epoch; it may be in the past: overdue).

    AfterEvents has no clock: `now_ms` once its count is reached, else None."""
    if isinstance(schedule, AfterEvents):
        return now_ms if events_since(schedule, state) >= schedule.n else None
    start = now_ms if state.start_ms is None else state.start_ms
    return _time_due(schedule, state.fires.get(schedule.name), start)


def is_due(schedule: Schedule, state: SchedulesState, now_ms: int) -> bool:
    """Whether `schedule` is due at `now_ms`."""
    due = next_due(schedule, state, now_ms)
    return due is not None and due <= now_ms


def ms_until_due(schedules: Iterable[Schedule], state: SchedulesState, now_ms: int
                 ) -> int | None:
    """Milliseconds until the soonest of `schedules` is due (0: one is due now), or None when
    none has a due time: a rule returns `min(tick_ms, this)` so the tick wakes for it."""
    waits = [max(0, due - now_ms) for s in schedules
             if (due := next_due(s, state, now_ms)) is not None]
    return min(waits, default=None)


async def _latest(store: EventStore, name: str) -> LastFire | None:
    """The schedule's latest fire from an origin that counts (FIRE_ORIGINS); the fires of
    other origins are skipped (the first read looks at the newest 50, enough unless the key
    is flooded with them)."""
    newest = await store.read(key=schedule_key(name), kinds=[FIRED], limit=50,
                              newest_first=True)
    if len(newest) == 50:
        newest = await store.read(key=schedule_key(name), kinds=[FIRED], newest_first=True)
    return next((_last_fire(e) for e in newest if fires_from(e.origin)), None)


async def _start_ms(store: EventStore, fallback: int) -> int:
    first = await store.read(limit=1)
    return first[0].ts if first else fallback


async def _count_after(store: EventStore, schedule: AfterEvents, after_seq: int) -> int:
    seen = 0
    kinds: Any = None if schedule.kinds is None else list(schedule.kinds)
    async for page in store.pages(after_seq, kinds=kinds, limit=max(schedule.n, 100)):
        seen += sum(1 for event in page.events if event.kind != FIRED)
        if seen >= schedule.n:
            break
    return seen


async def fire_schedule(store: EventStore, schedule: Schedule, due_at: int, now_ms: int, *,
                        origin: str = "engine") -> Event | None:
    """Record that `schedule` fired for `due_at` (from `next_due`), or None when it is not
    due after all: another engine or cycle fired it first, or a fresh read of the log says
    it is not due yet. The check is made again on the log itself, so a stale state can never
    fire a schedule twice; the append expects the key's version and carries the idempotency
    key `schedule:<name>:<due_at>` (when another event holds that key, the fire is made
    without it: the expected version alone keeps it single). InvalidEvent (nothing written)
    when `origin` is not one whose fires count (FIRE_ORIGINS)."""
    if not fires_from(origin):
        raise InvalidEvent(f"fire_schedule: origin {origin!r} does not record schedule fires — "
                         f"use one of {', '.join(FIRE_ORIGINS)} (with any ':suffix')")
    check_ms(now_ms, "now_ms")
    version = await store.head(schedule_key(schedule.name))  # before the check: a fire
    last = await _latest(store, schedule.name)  # committed after it fails the append
    if isinstance(schedule, AfterEvents):
        if await _count_after(store, schedule, last.event_seq if last else 0) < schedule.n:
            return None
    else:
        fresh = _time_due(schedule, last, await _start_ms(store, now_ms))
        if fresh != due_at or due_at > now_ms:
            return None
    head = await store.last_seq()
    data = msgspec.to_builtins(ScheduleFired(check_ms(due_at, "due_at"), now_ms, head))
    for idem in (f"schedule:{schedule.name}:{due_at}", None):
        draft = EventDraft(FIRED, schedule_key(schedule.name), data, origin=origin, idem=idem)
        try:
            result = await store.append([draft], expect={schedule_key(schedule.name): version})
        except VersionConflict:
            return None
        except IdempotencyConflict:
            if await store.head(schedule_key(schedule.name)) != version:
                return None  # a fire of this due time (or another move) came first
            continue  # the idem is held by some other event: fire without it
        return None if result.replayed else result.events[0]
    return None  # pragma: no cover — the second draft has no idem to conflict on
