"""Mnemonic metabolism: memory strength decays in bounded, crash-safe batches.

Memory strength is how readily a record comes to mind, never how true it is: decay writes
only `memory-metabolized` events, which no fold reads as confidence (a state item's
confidence is written by state-set and state-revised alone).

A sweep belongs to one `cycle_start` (a ms timestamp chosen once per maintenance cycle and
reused across crash retries). Each decayed record's `last_metabolized_at` is stamped with it
in the same event that lowers its strength, and only records whose stamp is older are
picked, so a sweep cut short and run again with the same `cycle_start` never decays a record
twice. Every write expects the identity's version: a conflict means re-read, re-evaluate,
retry once, then defer that identity to the next cycle (counted, never lost).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping

import msgspec

from pulse_core._errors import InvalidTransition, VersionConflict
from pulse_core._events import Event, EventDraft
from pulse_core.maintenance._activities import retry_once
from pulse_core.maintenance._element_kinds import Reinforced, SalienceSet, element_id
from pulse_core.maintenance._element_queries import decay_queue, decays
from pulse_core.maintenance._element_state import Element, ElementsState
from pulse_core.maintenance._elements import ElementsReader
from pulse_core.memory import identity_key
from pulse_core.store import EventStore

__all__ = ["Appended", "Authorize", "DecayPolicy", "SweepReport", "decayed_strength", "reinforce",
           "set_salience", "sweep"]

MAINTENANCE_ORIGIN = "executor:maintenance"


class DecayPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How a sweep decays: strength *= `factor` down to `floor`, `limit` records per batch;
    a record with salience >= `protection` is never decayed."""

    factor: float = 0.97
    floor: float = 0.05
    protection: float = 0.8
    limit: int = 10_000

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and 0.0 < self.factor < 1.0):
            raise ValueError(f"factor {self.factor!r} must be strictly between 0 and 1")
        if not (math.isfinite(self.floor) and 0.0 <= self.floor < 1.0):
            raise ValueError(f"floor {self.floor!r} must be in [0, 1)")
        if not (math.isfinite(self.protection) and 0.0 < self.protection <= 1.0):
            raise ValueError(f"protection {self.protection!r} must be in (0, 1]")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ValueError(f"limit {self.limit!r} must be an int >= 1")


class SweepReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a sweep did: records decayed, records left alone because protected (salience,
    legal hold, a pending high-impact commitment), batches run, appends written and the
    events they held, version conflicts met, element ids deferred to the next cycle, and
    whether it ran to the end (False when `max_batches` cut it short)."""

    decayed: int = 0
    protected: int = 0
    batches: int = 0
    writes: int = 0
    events: int = 0
    conflicts: int = 0
    deferred: tuple[str, ...] = ()
    complete: bool = True


def decayed_strength(strength: float, policy: DecayPolicy) -> float:
    """`strength` after one decay: max(floor, strength * factor), rounded to 6 places."""
    return max(policy.floor, round(strength * policy.factor, 6))


Appended = Callable[[tuple[Event, ...]], Awaitable[None]]
"""Awaited with the events of each append a sweep made (e.g. to count them without
reading them back)."""

Authorize = Callable[[], Awaitable[Mapping[str, int]]]
"""A sweep's per-append authorization: raises to stop the sweep (NotAuthorized), or returns
the key versions the check read (e.g. {"authority:maintenance": 7}), expected by the append so
a grant revoked between the check and the write makes the write conflict, not land."""


class _Sweep:
    """One sweep's settings and running counts."""

    def __init__(self, store: EventStore, reader: ElementsReader, cycle_start: int,
                 policy: DecayPolicy, origin: str, *, authorize: Authorize | None = None,
                 appended: Appended | None = None, cause: int | None = None) -> None:
        self.store, self.reader, self.origin = store, reader, origin
        self.authorize, self.appended, self.cause = authorize, appended, cause
        self.cycle_start, self.policy = cycle_start, policy
        self.decayed = self.writes = self.events = self.conflicts = 0
        self.deferred: list[str] = []
        # The state the queue was found in, or one that differs from it only by this sweep's
        # own batches (which changed none of the elements still queued); None: not known.
        self.queued_from: ElementsState | None = None
        self.written: ElementsState | None = None  # the fold after the last write, if taken

    def plan(self, state: ElementsState, queued: Iterable[Element]
             ) -> dict[str, dict[str, float]]:
        """New strengths by identity for those of `queued` still eligible in `state`. An
        element that is the very object queued is unchanged since it was found eligible
        (elements are immutable; every event that changes one makes a new one): it is not
        judged again."""
        plan: dict[str, dict[str, float]] = defaultdict(dict)
        elements = None if state is self.queued_from else state.elements  # None: unchanged
        policy = self.policy
        strengths: dict[float, float] = {}  # decayed_strength of each strength met
        for was in queued:
            e = was if elements is None else elements.get(was.id)
            if e is was or (e is not None and decays(e, self.cycle_start, policy.floor,
                                                     policy.protection)):
                new = strengths.get(e.strength)
                if new is None:
                    new = strengths[e.strength] = decayed_strength(e.strength, policy)
                plan[e.identity][e.record] = new
        return dict(plan)

    def draft(self, identity: str, records: dict[str, float]) -> EventDraft:
        # Metabolized as builtins, written out: the store checks it against Metabolized
        data = {"cycle_start": self.cycle_start, "factor": self.policy.factor,
                "strengths": records}
        return EventDraft("memory-metabolized", identity_key(identity), data,
                          origin=self.origin, cause=self.cause)

    async def batch(self, queued: list[Element]) -> None:
        """Decay `queued` (those still eligible): one append. On a conflict the log is read
        again: the identities that moved are written one by one (`one`), the rest again in
        one append on the fresh read, and one by one if that conflicts too."""
        guard = await self.authorize() if self.authorize is not None else {}
        state = await self.reader.current()
        plan = self.plan(state, queued)
        if not plan:
            return
        if await self.write(plan, self.expect(plan, state, guard)):
            if state is self.queued_from:  # nothing but this batch came since the queue:
                self.queued_from = self.written  # the later batches' elements are as queued
            return
        fresh = await self.reader.current()
        mine: dict[str, list[Element]] = defaultdict(list)  # the queued, by identity
        for e in queued:
            if e.identity in plan:
                mine[e.identity].append(e)
        lost = {i for i in plan if fresh.versions.get(i, 0) != state.versions.get(i, 0)}
        steady = [e for i, queued_of in mine.items() if i not in lost for e in queued_of]
        if steady:
            guard = await self.authorize() if self.authorize is not None else {}
            again = self.plan(fresh, steady)
            if again and not await self.write(again, self.expect(again, fresh, guard)):
                lost = set(plan)
        for identity in plan:
            if identity in lost:
                await self.one(identity, mine[identity])

    async def write(self, plan: dict[str, dict[str, float]], expect: Mapping[str, int]
                    ) -> bool:
        """Append `plan` in one transaction expecting `expect`; False (counted) on a version
        conflict."""
        drafts = [self.draft(identity, records) for identity, records in plan.items()]
        try:
            written = await self.store.append(drafts, expect=expect)
        except VersionConflict:
            self.conflicts += 1
            return False
        self.written = await self.reader.take(written.events)
        if self.appended is not None:
            await self.appended(written.events)
        self.decayed += sum(len(r) for r in plan.values())
        self.writes += 1
        self.events += len(drafts)
        return True

    @staticmethod
    def expect(plan: dict[str, dict[str, float]], state: ElementsState,
               guard: Mapping[str, int]) -> dict[str, int]:
        """`guard` and each identity's version in `state`: what an append of `plan` expects."""
        return {**guard, **{identity_key(i): state.versions.get(i, 0) for i in plan}}

    async def one(self, identity: str, queued: list[Element]) -> None:
        """Decay one identity's `queued` on fresh reads: retried once, then deferred."""
        for attempt in range(2):
            guard = await self.authorize() if self.authorize is not None else {}
            fresh = await self.reader.current()
            mine = self.plan(fresh, queued).get(identity, {})
            if not mine:
                return
            if await self.write({identity: mine}, self.expect({identity: mine}, fresh, guard)):
                return
            if attempt == 1:
                self.deferred.extend(element_id(identity, r) for r in mine)


async def sweep(store: EventStore, reader: ElementsReader, *, cycle_start: int,
                policy: DecayPolicy | None = None, origin: str = MAINTENANCE_ORIGIN,
                max_batches: int | None = None, max_elements: int | None = None,
                authorize: Authorize | None = None, appended: Appended | None = None,
                cause: int | None = None) -> SweepReport:
    """Decay every eligible record once for `cycle_start`, `policy.limit` per batch.

    Batches repeat until one decays fewer than `limit` records (or `max_batches` ran, or the
    first `max_elements` of the queue were taken: a budget). A batch is one append holding a
    `memory-metabolized` per identity, each identity's version expected; on a conflict the
    log is read again, the identities that moved are written one by one, each re-read and
    re-evaluated, retried once, and deferred when it conflicts again; the others are written
    again in one append (one by one if that conflicts too).

    `authorize`, when given, is awaited before every append (each batch, each retry) and
    raises to stop the sweep there (e.g. NotAuthorized once a grant was revoked);
    the key versions it returns are expected by that append, so a revocation between the
    check and the write conflicts and is seen at the re-check. What earlier batches wrote
    stays, and a later sweep with the same `cycle_start` goes on from where this one stopped.
    Every event it writes has `cause` (e.g. the seq of the activity the sweep is part of);
    `appended`, when given, is awaited with the events of each append.
    """
    policy = policy or DecayPolicy()
    run = _Sweep(store, reader, cycle_start, policy, origin, authorize=authorize,
                 appended=appended, cause=cause)
    state = await reader.current()
    queue, protected = decay_queue(state, cycle_start=cycle_start, floor=policy.floor,
                                   protection=policy.protection)
    run.queued_from = state
    taken = queue if max_elements is None else queue[:max(max_elements, 0)]
    batches = position = 0
    while max_batches is None or batches < max_batches:
        batch = taken[position:position + policy.limit]
        position += len(batch)
        batches += 1
        await run.batch(batch)
        if len(batch) < policy.limit or position >= len(taken):
            break
    return SweepReport(decayed=run.decayed, protected=protected, batches=batches,
                       writes=run.writes, events=run.events, conflicts=run.conflicts,
                       deferred=tuple(run.deferred), complete=position >= len(queue))


async def _guarded(store: EventStore, reader: ElementsReader, identity: str, *,
                   kind: str, body: Reinforced | SalienceSet, origin: str) -> Event:
    record = body.record

    async def attempt() -> Event:
        state = await reader.current()
        if element_id(identity, record) not in state.elements:
            raise InvalidTransition(f"no live element {element_id(identity, record)!r}: it was "
                                "never recorded, or was forgotten or purged")
        draft = EventDraft(kind, identity_key(identity), msgspec.to_builtins(body),
                           origin=origin)
        expect = {identity_key(identity): state.versions.get(identity, 0)}
        return (await store.append([draft], expect=expect)).events[0]

    return await retry_once(attempt)


async def reinforce(store: EventStore, reader: ElementsReader, identity: str, record: str,
                    *, strength: float = 1.0, reason: str = "",
                    origin: str = MAINTENANCE_ORIGIN) -> Event:
    """Set a record's memory strength explicitly (`memory-reinforced`), e.g. after it was
    used; decay starts from there at the next cycle."""
    return await _guarded(store, reader, identity, kind="memory-reinforced", origin=origin,
                          body=Reinforced(record=record, strength=strength, reason=reason))


async def set_salience(store: EventStore, reader: ElementsReader, identity: str, record: str,
                       salience: float, *, reason: str = "",
                       origin: str = MAINTENANCE_ORIGIN) -> Event:
    """Set a record's salience (`salience-set`); at or above the policy's protection it is
    never decayed."""
    return await _guarded(store, reader, identity, kind="salience-set", origin=origin,
                          body=SalienceSet(record=record, salience=salience, reason=reason))
