"""Watches, the data: the watch kinds and their payloads, the fold of a watch's events, the
Watches projection, the `matches` predicate and the index that finds, for one event, the armed
watches it may match (pulse_core.maintenance._watches arms, evaluates and decides them).

Every number a watch payload carries is bounded (a time in 0..MAX_MS, a seq in 0..MAX_SEQ, a
priority in -MAX_PRIORITY..MAX_PRIORITY), so a hostile `watch-armed` is refused at append.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from pulse_core._errors import InvalidTransition
from pulse_core._events import MAX_SEQ, Event, register_kind
from pulse_core._pmap import PersistentMap
from pulse_core._snapshot import Projection
from pulse_core.maintenance._schedules import MAX_MS, check_ms
from pulse_core.maintenance._sleep import check_priority
from pulse_core.store import EventStore

CLASSES = ("delta", "silence")
DECISIONS = ("act", "ask", "defer", "silence")
PRODUCES = ("sleep-task", "wake")
MACHINE_PREFIXES = ("activity:watch_fire:", "activity:action_gate:", "sleep:watch_fire:")
"""Keys of what the watch machinery writes besides watch-* events: never a trigger."""


class WatchCondition(msgspec.Struct, frozen=True, kw_only=True):
    """What a matching change looks like; every field set must match (empty: any)."""

    key_prefix: str = ""
    kinds: tuple[str, ...] = ()
    record: str = ""
    origin_prefix: str = ""

    def matches(self, event: Event) -> bool:
        """Whether `event` matches (the machinery's own events never do: see `is_machinery`)."""
        return matches(self, event)


def matches(condition: WatchCondition, event: Event) -> bool:
    """Whether `event` matches `condition`: a cheap, pure predicate (no store), the one the
    evaluation uses. The watch machinery's own events never match (`is_machinery`)."""
    if is_machinery(event):
        return False
    if not event.key.startswith(condition.key_prefix) or (
            condition.kinds and event.kind not in condition.kinds):
        return False
    if condition.record and not (isinstance(event.data, dict)
                                 and event.data.get("record") == condition.record):
        return False
    return event.origin.startswith(condition.origin_prefix)


def _check_seq(value: int | None, what: str) -> None:
    if value is not None and not 0 <= value <= MAX_SEQ:
        raise ValueError(f"{what} {value} is not a seq (0..{MAX_SEQ})")


class WatchArmed(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of watch-armed. A fire produces a sleep task of `task_class` (or a wake)."""

    watch_class: str
    condition: WatchCondition = WatchCondition()
    due_at: int | None = None
    reason: str = ""
    produces: str = "sleep-task"
    task_class: str = "watch_review"
    priority: int = 0

    def __post_init__(self) -> None:
        if self.watch_class not in CLASSES:
            raise ValueError(f"watch_class {self.watch_class!r} is not delta or silence")
        if self.watch_class == "silence" and self.due_at is None:
            raise ValueError("a silence watch needs due_at (ms): the time by which the "
                             "change is expected")
        if self.due_at is not None:
            check_ms(self.due_at, "due_at")
        if self.produces not in PRODUCES:
            raise ValueError(f"produces {self.produces!r} is not sleep-task or wake")
        check_priority(self.priority)


class WatchFired(msgspec.Struct, frozen=True):
    """Payload of watch-fired: the matching change (None for silence), the due time (for
    silence), and what it produced: a sleep task id, or "wake"."""

    trigger_seq: int | None
    due_at: int | None
    produced: str

    def __post_init__(self) -> None:
        _check_seq(self.trigger_seq, "trigger_seq")
        if self.due_at is not None:
            check_ms(self.due_at, "due_at")


class WatchSatisfied(msgspec.Struct, frozen=True):
    """Payload of watch-satisfied: the change that came by due_at."""

    trigger_seq: int

    def __post_init__(self) -> None:
        _check_seq(self.trigger_seq, "trigger_seq")


class WatchDisarmed(msgspec.Struct, frozen=True):
    """Payload of watch-disarmed."""

    reason: str = ""


class WatchDecided(msgspec.Struct, frozen=True):
    """Payload of watch-decided: the outward decision after a fire, and what it applied."""

    decision: str
    reason: str = ""
    inputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise ValueError(f"decision {self.decision!r} is not one of {', '.join(DECISIONS)}")


register_kind("watch-armed", "a delta or silence watch was armed; key: watch:<id>", WatchArmed)
register_kind("watch-fired", "a watch fired: it produced a sleep task or a wake, and "
              "authorizes nothing", WatchFired)
register_kind("watch-satisfied", "a silence watch's change arrived by due_at: no fire",
              WatchSatisfied)
register_kind("watch-disarmed", "a watch was disarmed before it fired", WatchDisarmed)
register_kind("watch-decided", "the decision after a fire (act, ask, defer or silence), "
              "recorded whatever it is", WatchDecided)

WATCH_KINDS = frozenset({"watch-armed", "watch-fired", "watch-satisfied", "watch-disarmed",
                         "watch-decided"})


def is_machinery(event: Event) -> bool:
    """Whether `event` was written by the watch machinery itself (so it never triggers)."""
    return event.kind in WATCH_KINDS or event.key.startswith(MACHINE_PREFIXES)


class Watch(msgspec.Struct, frozen=True, gc=False):
    """A watch's current form. `status`: armed, fired, satisfied or disarmed; `fired_op` is
    the operation key of its latest fire, `decision` what was decided after it and
    `decided_by` the origin that decided."""

    id: str
    spec: WatchArmed
    status: str
    version: int
    armed_at: int
    armed_seq: int
    trigger_seq: int | None = None
    produced: str | None = None
    fired_op: str | None = None
    decision: str | None = None
    decided_by: str | None = None


def watch_key(watch_id: str) -> str:
    """The event key of watch `watch_id`."""
    return f"watch:{watch_id}"


def fire_operation(watch: Watch, trigger_seq: int | None) -> str:
    """The operation (and activity) key of a fire: watch_fire:<id>:<seq> for a delta,
    watch_fire:<id>:silence:<due_at> for a silence."""
    if watch.spec.watch_class == "silence":
        return f"watch_fire:{watch.id}:silence:{watch.spec.due_at}"
    return f"watch_fire:{watch.id}:{trigger_seq}"


def fold_watch(state: Watch | None, event: Event) -> Watch | None:
    """The watch after `event`; InvalidTransition when its status does not allow it."""
    watch_id = event.key.removeprefix("watch:")
    if event.kind == "watch-armed":
        if state is not None and state.status == "armed":
            raise InvalidTransition(f"watch {watch_id!r} is already armed — disarm it first")
        return Watch(watch_id, event.payload(WatchArmed), "armed", event.version, event.ts,
                     event.seq)
    if event.kind not in WATCH_KINDS:
        return state
    if state is None:
        raise InvalidTransition(f"{event.kind}: there is no watch {watch_id!r}")
    if event.kind == "watch-decided":
        if state.status != "fired" or state.decision is not None:
            raise InvalidTransition(f"watch-decided: watch {watch_id!r} is {state.status}"
                                    f"{', already decided' if state.decision else ''} — a "
                                    "decision follows a fire, once")
        return msgspec.structs.replace(state, decision=event.payload(WatchDecided).decision,
                                       decided_by=event.origin, version=event.version)
    if state.status != "armed":
        raise InvalidTransition(f"{event.kind}: watch {watch_id!r} is {state.status}, not "
                                "armed — arm it again to watch anew")
    if event.kind == "watch-fired":
        body = event.payload(WatchFired)
        op = fire_operation(state, body.trigger_seq)
        return msgspec.structs.replace(state, status="fired", trigger_seq=body.trigger_seq,
                                       produced=body.produced, fired_op=op,
                                       version=event.version)
    if event.kind == "watch-satisfied":
        return msgspec.structs.replace(
            state, status="satisfied", trigger_seq=event.payload(WatchSatisfied).trigger_seq,
            version=event.version)
    return msgspec.structs.replace(state, status="disarmed", version=event.version)


def apply_watch_event(state: PersistentMap[str, Watch], event: Event
                      ) -> PersistentMap[str, Watch]:
    """`state` after `event` (events of other keys, repeats and refused transitions leave
    it as it is)."""
    if not event.key.startswith("watch:"):
        return state
    watch_id = event.key.removeprefix("watch:")
    current = state.get(watch_id)
    if current is not None and event.version <= current.version:
        return state  # already folded
    try:
        watch = fold_watch(current, event)
    except InvalidTransition:
        return state  # written by a writer that skipped the checks; ignore
    return state if watch is None else state.set(watch_id, watch)


class Watches(Projection[PersistentMap[str, Watch]]):
    """Every watch by id (Watch)."""

    name = "watches"
    kinds = WATCH_KINDS
    version = 2  # 2: Watch.decided_by

    def initial(self) -> PersistentMap[str, Watch]:
        return PersistentMap()

    def apply(self, state: PersistentMap[str, Watch], event: Event
              ) -> PersistentMap[str, Watch]:
        return apply_watch_event(state, event)


def armed(watches: Mapping[str, Watch]) -> list[Watch]:
    """Armed watches, soonest due first (delta watches, which have no due time, last)."""
    found = [w for w in watches.values() if w.status == "armed"]
    found.sort(key=lambda w: (w.spec.due_at is None, w.spec.due_at or 0, w.armed_seq))
    return found


def past_due(watches: Mapping[str, Watch], now_ms: int) -> list[Watch]:
    """Armed silence watches whose due_at has passed: the next evaluation decides them."""
    return [w for w in armed(watches) if w.spec.due_at is not None and w.spec.due_at <= now_ms]


async def read_watch(store: EventStore, watch_id: str) -> Watch | None:
    """Watch `watch_id` as the log holds it now, or None."""
    state: PersistentMap[str, Watch] = PersistentMap()
    for event in await store.read(key=watch_key(watch_id), kinds=WATCH_KINDS):
        state = apply_watch_event(state, event)
    return state.get(watch_id)


_Slot = tuple[str | None, str]
"""An index slot: (a kind, or None for watches with no kinds; a record, or "")."""


class WatchIndex:
    """Watches by what they match: per slot (a kind, None for watches with no kinds; a
    record, "" for any), then per (key-prefix length, origin-prefix length), then per
    (key prefix, origin prefix). `candidates(event)` costs a dict look-up per distinct pair
    of prefix lengths in at most four slots, instead of a test of every watch: only watches
    whose every field admits the event come back (confirm with `matches`, which also refuses
    the machinery's own events)."""

    def __init__(self, watches: Iterable[Watch] = ()) -> None:
        self._slots: dict[_Slot, dict[tuple[int, int],
                                      dict[tuple[str, str], dict[str, Watch]]]] = {}
        self._held: dict[str, Watch] = {}
        for watch in watches:
            self.add(watch)

    def __len__(self) -> int:
        return len(self._held)

    @staticmethod
    def _places(watch: Watch) -> list[tuple[_Slot, tuple[int, int], tuple[str, str]]]:
        c = watch.spec.condition
        lengths, prefixes = (len(c.key_prefix), len(c.origin_prefix)), (c.key_prefix,
                                                                         c.origin_prefix)
        return [((kind, c.record), lengths, prefixes) for kind in set(c.kinds) or (None,)]

    def add(self, watch: Watch) -> None:
        """Index `watch` (replacing an earlier form of the same id)."""
        self.remove(watch.id)
        for slot, lengths, prefixes in self._places(watch):
            table = self._slots.setdefault(slot, {}).setdefault(lengths, {})
            table.setdefault(prefixes, {})[watch.id] = watch
        self._held[watch.id] = watch

    def remove(self, watch_id: str) -> None:
        """Forget watch `watch_id` (nothing when it is not indexed)."""
        watch = self._held.pop(watch_id, None)
        if watch is None:
            return
        for slot, lengths, prefixes in self._places(watch):
            by_length = self._slots[slot]
            table = by_length[lengths]
            bucket = table[prefixes]
            bucket.pop(watch_id, None)
            if not bucket:
                del table[prefixes]
                if not table:
                    del by_length[lengths]
                    if not by_length:
                        del self._slots[slot]

    def candidates(self, event: Event) -> list[Watch]:
        """The indexed watches whose kinds, record, key prefix and origin prefix admit
        `event`."""
        record = event.data.get("record") if isinstance(event.data, dict) else None
        records = ("", record) if isinstance(record, str) and record else ("",)
        found: dict[str, Watch] = {}
        key, origin = event.key, event.origin
        for kind in (event.kind, None):
            for rec in records:
                by_length = self._slots.get((kind, rec))
                if not by_length:
                    continue
                for (klen, olen), table in by_length.items():
                    if klen <= len(key) and olen <= len(origin) and (
                            bucket := table.get((key[:klen], origin[:olen]))):
                        found.update(bucket)
        return list(found.values())


def delta_fires(watches: Mapping[str, Watch] | WatchIndex, events: Iterable[Event]
                ) -> dict[str, Event]:
    """The armed delta watches that `events` (oldest first) would fire, each with its first
    matching event after its arming: a cheap check with no store (a rule can tell between
    cycles that a delta watch has something to fire). Watch events among `events` are not
    folded: pass a state that already holds them (a snapshot's Watches)."""
    index = watches if isinstance(watches, WatchIndex) else WatchIndex(
        w for w in watches.values() if w.status == "armed" and w.spec.watch_class == "delta")
    found: dict[str, Event] = {}
    for event in events:
        if is_machinery(event):
            continue
        for watch in index.candidates(event):
            if (watch.id not in found and watch.status == "armed"
                    and watch.spec.watch_class == "delta" and event.seq > watch.armed_seq
                    and matches(watch.spec.condition, event)):
                found[watch.id] = event
    return found


__all__ = [
    "CLASSES", "DECISIONS", "MACHINE_PREFIXES", "MAX_MS", "PRODUCES", "WATCH_KINDS", "Watch",
    "WatchArmed", "WatchCondition", "WatchDecided", "WatchDisarmed", "WatchFired", "WatchIndex",
    "WatchSatisfied", "Watches", "apply_watch_event", "armed", "delta_fires", "fire_operation",
    "fold_watch", "is_machinery", "matches", "past_due", "read_watch", "watch_key",
]
