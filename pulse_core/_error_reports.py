"""The engine's error reports: each recorded as an `error` event, and none lost to a store
outage.

A report the store refuses as unavailable (a database restarting, a lost connection, a full
disk: StoreUnavailable) is kept, and recorded once the store answers again, marked `late` with
the time it was made (`reported_at`, engine clock ms). An outage keeps at most KEEP_AT_MOST
reports; the ones after those are counted, and one more error, recorded after the kept ones,
says how many were not kept. Every report carries an idempotency key, and an append whose
outcome the store cannot tell (AppendOutcomeUnknown) is sent again unchanged (a report it
held is not marked late: it may be stored already), so nothing is recorded twice: reports
counted after such an append get a count of their own. Kept reports are tried again at
each new report, after each commit this process sees (on PostgreSQL, other processes' too)
and otherwise after LATE_BACKOFF; at close, once more, and what still cannot be recorded is
logged with its count.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import msgspec

from pulse_core._backoff import Backoff
from pulse_core._clock import Clock
from pulse_core._errors import AppendOutcomeUnknown, StoreClosed, StoreUnavailable
from pulse_core._events import EventDraft, error_draft
from pulse_core._waits import wait_signal
from pulse_core.store import EventStore

log = logging.getLogger("pulse")

KEEP_AT_MOST = 100
"""How many error reports an outage keeps to record late; past them, reports are counted."""

LATE_BACKOFF = Backoff(initial_ms=200, factor=2.0, max_ms=5_000, jitter=0.1)
"""Spacing of the tries to record the kept reports while the store stays unavailable."""

NOT_KEPT = "engine:store-outage"
"""The key of the error that counts the reports an outage did not keep."""

Spawn = Callable[[str, Coroutine[Any, Any, None]], object]


class ErrorReports:
    """An engine's error reports: while it is open (between `open` and `close`), recorded in
    its log in the background; keeps those the store refuses as unavailable and records them
    late (see the module). Logged when the engine is not open."""

    def __init__(self, clock: Clock, host: str = "") -> None:
        self.clock = clock
        #: the host the reports name, where engines of several hosts share the log
        self.host = host
        self.limit = KEEP_AT_MOST
        self.events: EventStore | None = None
        self._spawn: Spawn | None = None
        self._kept: list[EventDraft] = []
        self._not_kept = 0  # counted, and in no count yet
        self._not_kept_since = 0  # reported_at of the first of them
        self._counting = 0  # of those, how many the count being appended holds
        self._sent: list[EventDraft] = []  # counts of an append that may be stored: resent
        self._recording = asyncio.Lock()
        self._wake: asyncio.Event | None = None  # record_late's signal

    @property
    def waiting(self) -> int:
        """How many reports wait to be recorded (kept, or only counted)."""
        return len(self._kept) + self._not_kept + self._counting + _counted(self._sent)

    def open(self, events: EventStore, spawn: Spawn) -> None:
        """Record reports in `events` from now on, each in a background task from `spawn`."""
        self.events, self._spawn = events, spawn

    def close(self) -> None:
        """Log reports from now on (the log is closed)."""
        self.events = self._spawn = None

    def _log(self) -> EventStore:
        if self.events is None:
            raise StoreClosed("the engine is closed: its error reports are logged, not recorded")
        return self.events

    def report(self, where: str, exc: BaseException) -> None:
        """Record `exc`, raised at `where`, as an `error` event in the background (keyed
        `where`, or `engine:<where>` unless it names a watcher, rule, executor, service,
        layer or the engine); log it when the engine is not open."""
        if self._spawn is None:
            log.error("pulse: %s: %s: %s", where, type(exc).__name__, exc)
            return
        if not where.startswith(("watcher:", "rule:", "executor:", "service:", "layer:",
                                 "engine")):
            where = f"engine:{where}"
        at = self.clock.now_ms()
        draft = msgspec.structs.replace(error_draft(where, exc, host=self.host),
                                        idem=f"error:{uuid.uuid4().hex}")
        self._spawn(f"report:{where}", self._record(draft, at))

    def keep(self, drafts: Sequence[EventDraft], maybe_stored: bool = False) -> None:
        """Keep `drafts`, error events the store refused as unavailable, to record them late;
        `maybe_stored`: refused by AppendOutcomeUnknown, so they are sent again unchanged."""
        at = self.clock.now_ms()
        for draft in drafts:
            self._keep(draft, at, maybe_stored)

    def _keep(self, draft: EventDraft, at: int, maybe_stored: bool = False) -> bool:
        """Keep `draft` (made at `at`) marked late, or as it is when it may be stored already
        (it has an idempotency key; at most one append's drafts, kept past the limit too, so
        never counted as not kept), or count it past the limit; True if kept. A draft
        marked late gets an idempotency key of its own, so a retry of an append whose
        outcome the store could not tell never records it twice."""
        if not self.waiting and self._wake is not None:
            self._wake.set()  # record_late starts trying
        as_is = maybe_stored and draft.idem is not None  # past the limit too: it may be stored
        if as_is or len(self._kept) < self.limit:
            self._kept.append(draft if as_is else
                              msgspec.structs.replace(
                                  draft, data={**draft.data, "late": True, "reported_at": at},
                                  idem=f"late-error:{uuid.uuid4().hex}"))
            return True
        if not self._not_kept:
            self._not_kept_since = at
            if not self._counting and not self._sent:
                log.warning("pulse: %d error reports wait for the store; the next ones are "
                            "only counted until it answers again", self.limit)
        self._not_kept += 1
        return False

    async def _record(self, draft: EventDraft, at: int) -> None:
        """Append `draft`, after the reports that wait if any (so the order holds). When the
        store is unavailable the report is kept, and the StoreUnavailable raised again, saying
        so, for the background task to log."""
        waiting = bool(self.waiting)
        kept = self._keep(draft, at) if waiting else False
        try:
            if waiting:
                await self.record_waiting()
            else:
                await self._log().append([draft])
        except StoreUnavailable as exc:
            if not waiting:
                kept = self._keep(draft, at, isinstance(exc, AppendOutcomeUnknown))
            fate = ("kept, to be recorded when the store answers again" if kept else
                    f"only counted: {self.limit} reports wait already")
            raise StoreUnavailable(f"{exc} (this error report is {fate})") from exc

    async def record_waiting(self) -> None:
        """Append what waits, in one append: the kept reports, then, if some were only
        counted, the errors saying how many.

        Raises what the append raises. On StoreUnavailable the reports wait on (on
        AppendOutcomeUnknown, to be sent again unchanged); on any other error (the store
        refused them) they are logged and given up, and the error says why.
        """
        async with self._recording:
            kept, sent = list(self._kept), list(self._sent)
            counting, since = self._not_kept, self._not_kept_since
            if not kept and not sent and not counting:
                return
            counts = sent + [self._count(counting, since)] * bool(counting)
            # Reports counted while this append is under way get a count of their own.
            self._counting, self._not_kept = counting, 0
            try:
                await self._log().append(kept + counts)
            except AppendOutcomeUnknown:
                self._sent = counts  # may be stored: only ever sent again as they are
                raise
            except StoreUnavailable:  # not stored: its count takes the ones counted since
                if counting:
                    self._not_kept += counting
                    self._not_kept_since = since
                raise
            except Exception:
                log.error("pulse: %d error reports made while the store was unavailable were "
                          "refused by it and are given up%s", len(kept),
                          f" (and {_counted(counts)} more were only counted)" * bool(counts))
                self._forget(len(kept))
                raise
            finally:
                self._counting = 0
            self._forget(len(kept))
            log.info("pulse: recorded %d error reports late%s", len(kept),
                     f" and the count of {_counted(counts)} more" * bool(counts))

    def _forget(self, kept: int) -> None:
        del self._kept[:kept]
        self._sent = []

    def _count(self, not_kept: int, since: int) -> EventDraft:
        """The error that says `not_kept` reports, the first made at `since`, were not kept
        (its idempotency key is its own, so sent again it is recorded at most once)."""
        draft = error_draft(NOT_KEPT, StoreUnavailable(
            f"{not_kept} more error reports made while the store was unavailable (the first "
            f"at {since}, engine clock ms) were not kept: an outage keeps the first "
            f"{self.limit} and only counts the others"),
            {"late": True, "reported_at": since, "not_kept": not_kept}, host=self.host)
        return msgspec.structs.replace(draft, idem=f"late-errors-not-kept:{uuid.uuid4().hex}")

    async def record_late(self) -> None:
        """Record what waits as soon as the store answers: at each new report, after each
        commit this process sees, else after LATE_BACKOFF. Runs until cancelled."""
        events = self._log()
        wake = self._wake = events.subscribe()
        failures = 0
        try:
            while True:
                if not self.waiting:
                    failures = 0
                    await wake.wait()
                wake.clear()
                try:
                    await self.record_waiting()
                except StoreUnavailable:
                    failures += 1
                    await wait_signal(wake, LATE_BACKOFF.delay_ms(failures) / 1000)
        finally:
            self._wake = None
            events.unsubscribe(wake)

    async def settle(self) -> None:
        """At close: try once more to record what waits; log what still cannot be."""
        try:
            await self.record_waiting()
        except Exception as exc:
            if self.waiting:
                first = self._kept[0].data if self._kept else {}
                log.error("pulse: %d error reports made while the store was unavailable could "
                          "not be recorded (%s); the first: %s: %s: %s", self.waiting, exc,
                          first.get("where"), first.get("type"), first.get("message"))


def _counted(counts: Sequence[EventDraft]) -> int:
    """How many reports `counts` (errors counting reports not kept) count."""
    return sum(int(count.data["not_kept"]) for count in counts)
