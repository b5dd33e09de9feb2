"""Effects (actions described as data) and Executors (what carries them out).

An effect's life is a run of events on one key, the effect id::

    effect ─▶ effect-executing ─▶ effect-acked
                     │
                     └─▶ effect-failed ─(retry_at)─▶ effect-executing ─▶ ...
                                       └─(final)

A claim (`effect-executing`) carries a lease of `lease_ms`; when the lease runs out (timed
by each loop on its own clock from when it saw the claim), or its owner process is gone, the
effect can be claimed again with the next attempt number. An operator may cancel
a pending or retrying effect (`effect-cancelled`: it never runs) and retry one that failed for
good or was cancelled (`effect-retried`: pending again; see pulse_core._effect_control).
"""

from __future__ import annotations

import abc
import enum
import hashlib
from collections.abc import Sequence
from typing import Any, ClassVar

import msgspec

from pulse_core._backoff import Backoff
from pulse_core._clock import Clock
from pulse_core._errors import PulseError, UnknownEffect
from pulse_core._events import QUARANTINED, Event, EventDraft, uuid7
from pulse_core.store import EventStore, SideStore, VitalsStore

EFFECT_KINDS = frozenset({"effect", "effect-executing", "effect-acked", "effect-failed",
                          "effect-cancelled", "effect-retried"})

_effect_types: dict[str, type[Effect]] = {}


class Effect(msgspec.Struct, kw_only=True, tag_field="type"):
    """Base of every effect. Subclass with a tag: `class Notify(Effect, tag="notify")`.

    Effects are values: build a new one rather than changing a field.

    Where engines on several hosts share one log, an effect a tick decides runs on the host
    that decided it (a restart of a process there), unless its class sets `any_host = True`:
    then any engine sharing the log may run it (a review, a task).
    """

    any_host: ClassVar[bool] = False

    @classmethod
    def tag(cls) -> str:
        """The tag stored in events for this effect type."""
        tag = cls.__struct_config__.tag
        if not isinstance(tag, str):
            raise UnknownEffect(f"{cls.__name__} has no tag; declare class {cls.__name__}"
                                "(Effect, tag='...')")
        return tag

    def dedup_key(self) -> str:
        """Two effects with the same key are the same action; the dedup rule keeps one.

        Default: the tag and a digest of every field. Override to dedup more coarsely.
        """
        digest = hashlib.sha256(msgspec.json.encode(self)).hexdigest()[:24]
        return f"{type(self).tag()}:{digest}"


class Mark(Effect):
    """A fact a rule writes down about its own reasoning: a counter, a backoff, a once-only
    marker. A rule returns marks among its effects; the engine stores each as a `mark` event
    (key `mark:<tag>`) and no executor ever runs it. Projections fold them back with
    `decode_mark`, so rule state survives restarts and every reader of the log agrees.

    Subclass with a tag, like any effect: `class GaveUp(Mark, tag="gave-up")`.
    """


MARK_KIND = "mark"


def mark_draft(mark: Mark, origin: str, cause: int | None = None, *, host: str = ""
               ) -> EventDraft:
    """The `mark` event that records `mark` (made on `host`, when engines share the log)."""
    tag = type(mark).tag()
    data: dict[str, Any] = {"mark": msgspec.to_builtins(mark)}
    if host:
        data["host"] = host
    return EventDraft(MARK_KIND, f"mark:{tag}", data, origin=origin, cause=cause)


def host_of(event: Event) -> str:
    """The host an event (an effect, a mark, an error, a promotion) was made on, where engines
    of several hosts share the log ('' when it names none: any host, or a log only one engine
    writes)."""
    host = event.data.get("host") if isinstance(event.data, dict) else None
    return host if isinstance(host, str) else ""


def decode_mark(event: Event) -> Mark | None:
    """The Mark a `mark` event holds; None for another kind, a foreign tag or bad data."""
    if event.kind != MARK_KIND or not isinstance(event.data, dict):
        return None
    body = event.data.get("mark")
    tag = body.get("type") if isinstance(body, dict) else None
    if not isinstance(tag, str):
        return None
    try:
        cls = effect_type(tag)
        mark = msgspec.convert(body, cls)
    except (UnknownEffect, msgspec.ValidationError):
        return None
    return mark if isinstance(mark, Mark) else None


def _index_effect_types() -> None:
    pending: list[type[Effect]] = list(Effect.__subclasses__())
    while pending:
        cls = pending.pop()
        tag = cls.__struct_config__.tag
        if isinstance(tag, str):
            _effect_types[tag] = cls
        pending.extend(cls.__subclasses__())


def effect_type(tag: str) -> type[Effect]:
    """The Effect class declared with `tag`, or UnknownEffect."""
    if tag not in _effect_types:
        _index_effect_types()
    try:
        return _effect_types[tag]
    except KeyError:
        raise UnknownEffect(
            f"no Effect class declares tag {tag!r} in this process "
            f"(known: {', '.join(sorted(_effect_types)) or 'none'}) — import the module that "
            "defines it"
        ) from None


def decode_effect(data: Any) -> Effect:
    """The Effect stored in an `effect` event's data."""
    body = data.get("effect") if isinstance(data, dict) else None
    tag = body.get("type") if isinstance(body, dict) else None
    if not isinstance(tag, str):
        raise UnknownEffect(f"effect data {data!r} has no effect.type tag")
    return msgspec.convert(body, effect_type(tag))


def effect_draft(effect: Effect, origin: str, cause: int | None = None, *, host: str = ""
                 ) -> EventDraft:
    """The `effect` event that records `effect` under a new effect id. With `host` (engines
    sharing the log), only an engine of that host runs it, unless the effect's class allows
    any host."""
    type(effect).tag()
    data: dict[str, Any] = {"effect": msgspec.to_builtins(effect), "dedup": effect.dedup_key()}
    if host and not type(effect).any_host:
        data["host"] = host
    return EventDraft("effect", uuid7(), data, origin=origin, cause=cause)


class EffectOutcome(enum.Enum):
    """How one attempt ended."""

    ACKED = "acked"
    FAILED = "failed"
    RETRY = "retry"
    TIMED_OUT = "timed-out"
    INTERRUPTED = "interrupted"
    LOST_CLAIM = "lost-claim"


class ExecutionContext(msgspec.Struct, frozen=True):
    """What an executor knows about the attempt it runs, and the stores it may use: the log,
    the vitals and the side store of the engine running it (None outside an engine).

    `effect_id` is the same for every attempt: give it to an external system that can
    deduplicate, so a re-run after a crash is recognised. `idempotency_key` (effect id and
    attempt) names this one attempt.
    """

    effect_id: str
    attempt: int
    seq: int
    origin: str
    clock: Clock
    events: EventStore
    vitals: VitalsStore | None = None
    side: SideStore | None = None

    @property
    def idempotency_key(self) -> str:
        """`effect_id:attempt`."""
        return f"{self.effect_id}:{self.attempt}"


class Executor(abc.ABC):
    """Carries out effects of the types in `handles`; the ExecutorLoop decides when.

    `timeout` (seconds) bounds one attempt; `max_attempts` counts attempts including the first;
    `backoff` spaces retries. The result of `execute` is stored in `effect-acked` and must be
    JSON-encodable; an exception fails the attempt.
    """

    handles: ClassVar[tuple[type[Effect], ...]] = ()
    timeout: float = 30.0
    max_attempts: int = 3
    backoff: Backoff = Backoff()

    @property
    def name(self) -> str:
        """The executor's name in events: `executor:<name>`."""
        return type(self).__name__

    @abc.abstractmethod
    async def execute(self, effect: Any, ctx: ExecutionContext) -> Any:
        """Carry out `effect`; return a JSON-encodable result or raise."""


def executors_by_tag(executors: Sequence[Executor]) -> dict[str, Executor]:
    """Each effect tag and the one executor that handles it; PulseError naming both when two
    executors handle the same effect type."""
    by_tag: dict[str, Executor] = {}
    for executor in executors:
        for effect_type in executor.handles:
            tag = effect_type.tag()
            if tag in by_tag:
                raise PulseError(
                    f"effect {tag!r} is handled by both {by_tag[tag].name} and "
                    f"{executor.name}; one executor per effect type — drop one"
                )
            by_tag[tag] = executor
    return by_tag


class EffectStatus(enum.StrEnum):
    """Where an effect is in its life."""

    PENDING = "pending"
    EXECUTING = "executing"
    RETRYING = "retrying"
    ACKED = "acked"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED = frozenset({EffectStatus.ACKED, EffectStatus.FAILED, EffectStatus.CANCELLED})
"""The statuses no executor leaves: only an operator's retry moves a failed or cancelled
effect on."""


class EffectEntry(msgspec.Struct, gc=False):
    """Where one effect is in its life, folded from its events (the one fold of the effect
    lifecycle: the executor loop, the CLI and the survival ledger all read it).

    `status` is pending, executing, retrying (unfinished), acked, failed or cancelled
    (finished). `attempt` counts every attempt since the effect was recorded;
    `attempts_before_retry` those made before an operator's last retry, so the executor's
    `max_attempts` counts the attempts after it while attempt numbers (and the idempotency
    keys made of them) never repeat. `error` is the last attempt's error, kept through a
    retry. `lease_until` is the claim's lease end on its claimer's clock; `lease_ms` its
    length, the only part another host may rely on (their clocks need not agree).
    """

    id: str
    seq: int
    data: Any
    version: int
    status: EffectStatus
    attempt: int = 0
    attempts_before_retry: int = 0
    lease_until: int = 0
    lease_ms: int = 0
    owner: str = ""
    owner_pid: int = 0
    owner_started: float = 0.0
    retry_at: int = 0
    created_at: int = 0
    updated_at: int = 0
    origin: str = ""
    error: str | None = None
    result: Any = None

    @property
    def dedup(self) -> str:
        """The dedup key recorded with the effect."""
        return str(self.data.get("dedup", self.id)) if isinstance(self.data, dict) else self.id

    @property
    def host(self) -> str:
        """The host whose engines alone may run it ('' for any host)."""
        host = self.data.get("host") if isinstance(self.data, dict) else None
        return host if isinstance(host, str) else ""

    @property
    def tag(self) -> str:
        """The effect's type tag ('' when the stored data has none)."""
        body = self.data.get("effect") if isinstance(self.data, dict) else None
        tag = body.get("type") if isinstance(body, dict) else None
        return tag if isinstance(tag, str) else ""

    @property
    def body(self) -> Any:
        """The effect's fields as stored."""
        return self.data.get("effect") if isinstance(self.data, dict) else None

    @property
    def finished(self) -> bool:
        """Acked, failed for good, or cancelled."""
        return self.status in FINISHED


def _number(value: Any, default: float) -> float:
    """`value` if it is a finite number, else `default`: a field another writer filled badly
    must not stop the fold, which would stop every effect after it."""
    if isinstance(value, int | float) and not isinstance(value, bool) and abs(value) < 2**63:
        return value
    return default


def fold_effect(entry: EffectEntry | None, event: Event) -> EffectEntry | None:
    """The entry after `event`, finished states included (None: an event of an effect whose
    `effect` event was not seen). A field of the wrong type reads as its default."""
    if event.kind == "effect":
        return EffectEntry(event.key, event.seq, event.data, event.version, EffectStatus.PENDING,
                           created_at=event.ts, updated_at=event.ts, origin=event.origin)
    if entry is None:
        return None
    data = event.data if isinstance(event.data, dict) else {}
    if event.kind == QUARANTINED:
        # One of the effect's rows is unreadable. If it was the newest and a claim, that
        # attempt may have run: count it, and let the next claim come at once (its lease is
        # lost with it), as after a crash.
        lost_claim = (data.get("kind") == "effect-executing"
                      and _number(data.get("version"), 0) > entry.version)
        entry.version = event.version
        entry.updated_at = event.ts
        if lost_claim:
            entry.status = EffectStatus.EXECUTING
            entry.attempt += 1
            entry.lease_until, entry.lease_ms, entry.owner, entry.owner_pid = 0, 0, "", 0
        return entry
    entry.version = event.version
    entry.updated_at = event.ts
    if event.kind == "effect-executing":
        entry.status = EffectStatus.EXECUTING
        entry.attempt = int(_number(data.get("attempt"), entry.attempt + 1))
        entry.lease_until = int(_number(data.get("lease_until"), 0))
        # A claim written before claims said their length: its lease end less its commit
        # time, both on the claimer's clock.
        entry.lease_ms = max(0, int(_number(data.get("lease_ms"),
                                            entry.lease_until - event.ts)))
        entry.owner = str(data.get("owner", ""))
        entry.owner_pid = int(_number(data.get("pid"), 0))
        entry.owner_started = float(_number(data.get("started"), 0.0))
    elif event.kind == "effect-acked":
        entry.status = EffectStatus.ACKED
        entry.attempt = int(_number(data.get("attempt"), entry.attempt))
        entry.result = data.get("result")
    elif event.kind == "effect-failed":
        entry.attempt = int(_number(data.get("attempt"), entry.attempt))
        entry.error = str(data.get("error"))
        if data.get("final"):
            entry.status = EffectStatus.FAILED
        else:
            entry.status = EffectStatus.RETRYING
            entry.retry_at = int(_number(data.get("retry_at"), 0))
    elif event.kind == "effect-cancelled":
        entry.status = EffectStatus.CANCELLED
        entry.retry_at = 0
    elif event.kind == "effect-retried":
        # Pending again, as if new, except that attempts go on numbering from the last one.
        entry.status = EffectStatus.PENDING
        entry.attempts_before_retry = entry.attempt
        entry.retry_at = entry.lease_until = entry.lease_ms = entry.owner_pid = 0
        entry.owner, entry.owner_started, entry.result = "", 0.0, None
    return entry


def advance(entry: EffectEntry | None, event: Event) -> EffectEntry | None:
    """The entry after `event`, or None once the effect is finished (acked, finally failed
    or cancelled): the executor loop's index keeps unfinished effects only (and reads an
    effect's events again when a retry brings it back)."""
    folded = fold_effect(entry, event)
    return None if folded is None or folded.finished else folded
