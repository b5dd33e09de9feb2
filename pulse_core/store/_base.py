"""The EventStore: the log as pulse uses it, the same over every backend's Recorder."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from pulse_core._backoff import Backoff
from pulse_core._errors import (
    EventUnreadable,
    IdempotencyConflict,
    InvalidEvent,
    StoreReadOnly,
    StoreUnavailable,
)
from pulse_core._events import (
    QUARANTINED,
    Event,
    EventDraft,
    check_draft,
    check_text,
    uuid7,
)
from pulse_core._principals import Principal, PrincipalRefused, refusal_draft
from pulse_core._waits import wait_signal
from pulse_core.store._keys import ElementKeys, draft_element, seal_drafts
from pulse_core.store._recorder import (
    AppendResult,
    Page,
    PreparedAppend,
    PreparedDraft,
    Recorder,
    UnreadableEvent,
)

if TYPE_CHECKING:
    from pulse_core.store._objects import ObjectStore

__all__ = ["AppendResult", "EventStore", "Page", "UnreadableEvent"]

log = logging.getLogger("pulse.events")

#: seconds between reads of a cursor that is woken by other processes' commits anyway (a
#: backend that listens): only a safety net, should a wake ever be lost
SAFETY_POLL_S = 30.0
CURSOR_RETRY = Backoff(initial_ms=100, factor=2.0, max_ms=5_000, jitter=0.2)
"""How long a cursor (`changes`) that could not read waits before it reads again."""


class EventStore:
    """The append-only log: a change cursor, per-key versions, idempotency keys.

    Contract (tests/core/store_contract.py checks it for every recorder):
    - `seq` is gap-free and increases by one per stored event, across processes.
    - `version` counts events per key from 1; `expect={key: v}` refuses the whole append with
      VersionConflict unless the key is at version v (0 = no events yet) when it commits.
    - A draft whose `idem` is already stored with the same kind, key and data returns that
      event and writes nothing; with other content it raises IdempotencyConflict. One append
      may not repeat an `idem`.
    - Drafts are checked against the kinds catalogue before anything is written; an
      attachment goes to the object store and its digest to the event's `hash`.
    - With `keys`, a memory element's text and attachment are sealed with the element's key
      after the draft is checked (pulse_core/store/_keys.py): the log holds ciphertext.
    - An append is one transaction: all its drafts are stored, or none.
    - Stored events are never changed or deleted.
    - A row whose data cannot be decoded never reaches a reader as an Event. Once an
      `event-quarantined` event names it, every read leaves it out; a writable store
      quarantines such a row the first time a read meets it, a read-only one raises
      EventUnreadable naming its seq (`read_rows` lists it instead).

    Everything above the backend lives here; `recorder` inserts and selects.
    """

    def __init__(self, recorder: Recorder, *, objects: ObjectStore | None = None,
                 principal: Principal | None = None, keys: ElementKeys | None = None) -> None:
        self.recorder = recorder
        self.objects = objects
        self.principal = principal or Principal.human()
        self.keys = keys
        self._signals: set[asyncio.Event] = set()
        self._wakes = [0]  # shared with the handles as_principal gives, as _signals is
        self._quarantined: set[int] = set()
        self._listening: bool | None = None  # None: not asked yet (see subscribe)

    def as_principal(self, principal: Principal) -> EventStore:
        """A handle on the same log for `principal`, which this handle's principal may give
        (a person any, the engine an engine's or an agent's, an agent only its own; see
        Principal.acting_as). It shares this handle's connection: close this one, not it."""
        self.principal.acting_as(principal)
        view = copy.copy(self)
        view.principal = principal
        return view

    @property
    def read_only(self) -> bool:
        """Whether appends are refused (the store was opened read-only)."""
        return self.recorder.read_only

    # -- appending -------------------------------------------------------------------------

    async def append(
        self, drafts: Sequence[EventDraft], expect: Mapping[str, int] | None = None
    ) -> AppendResult:
        """Store `drafts` in one transaction, checking `expect` at commit time."""
        if self.recorder.read_only:
            raise StoreReadOnly(f"{self.recorder.location}: opened read-only, so appends are "
                                "refused — open the home without read_only to write")
        prepared: list[PreparedDraft] = []
        idems: dict[str, int] = {}
        raws: list[bytes] = []
        for index, given in enumerate(drafts):
            raws.append(check_draft(given, index))
            if not self.principal.allows(given.kind, given.origin):
                await self._record_refusal(given)
                raise PrincipalRefused(self.principal, given.kind, given.origin)
        if self.keys is not None and any(draft_element(d.kind, d.key, d.data) for d in drafts):
            sealed = await asyncio.to_thread(seal_drafts, self.keys, drafts)
            raws = [raw if new is old else check_draft(new, index)
                    for index, (raw, new, old) in enumerate(zip(raws, sealed, drafts,
                                                                 strict=True))]
            drafts = sealed
        ids = uuid7.many(len(drafts) + 1)  # the drafts' ids, then the append's tx
        for index, (draft, raw) in enumerate(zip(drafts, raws, strict=True)):
            if draft.idem is not None:
                if draft.idem in idems:
                    raise InvalidEvent(
                        f"draft {index} repeats idempotency key {draft.idem!r} of draft "
                        f"{idems[draft.idem]} in the same append")
                idems[draft.idem] = index
            digest = None
            if draft.attachment is not None:
                if self.objects is None:
                    raise InvalidEvent(f"draft {index}: has an attachment but no object store")
                digest = await self.objects.put(draft.attachment)
            prepared.append(PreparedDraft(ids[index], draft.kind, draft.key, draft.origin,
                                          draft.cause, draft.idem, raw, digest))
        checked: dict[str, int] = {}
        if expect:
            for key, version in expect.items():
                check_text(key, "key", f"expect[{key!r}]")
                if not isinstance(version, int) or isinstance(version, bool) or version < 0:
                    raise InvalidEvent(f"expect[{key!r}] = {version!r}: must be an int >= 0")
                checked[key] = version
        append = PreparedAppend(ids[-1], tuple(prepared), checked)
        try:
            result = await self.recorder.insert(append)
        except asyncio.CancelledError:
            self._wake()  # the insert may have committed: let subscribers look
            raise
        if result.events and not result.replayed:
            self._wake()
        return result

    async def require_person(self, kind: str, key: str, action: str) -> None:
        """Return if a person holds this handle; otherwise record the attempt (as a refused
        `kind` on `key`, like a refused append) and raise NotAuthorized naming `action`."""
        if self.principal.is_human:
            return
        await self._record_refusal(EventDraft(kind, key, None, origin=self.principal.origin))
        self.principal.require_person(kind, action)

    async def _record_refusal(self, draft: EventDraft) -> None:
        """Record that this handle's principal tried `draft` (once a minute per kind and
        origin); a failure to record is logged, never raised over the refusal itself."""
        minute = time.time_ns() // 60_000_000_000
        try:
            await self.append([refusal_draft(self.principal, draft, minute)])
        except IdempotencyConflict:
            pass  # this minute's record of the same attempt is stored already
        except Exception as exc:  # the refusal is what the caller must see
            log.warning("pulse: %s: could not record a refused append (%s)",
                        self.recorder.location, exc)

    def _wake(self) -> None:
        self._wakes[0] += 1
        for signal in self._signals:
            signal.set()

    @property
    def wakes(self) -> int:
        """How many times subscribers were woken (see `subscribe`) since this store opened,
        through any handle on its connection: unchanged, nothing was appended through them
        meanwhile (another process may have)."""
        return self._wakes[0]

    # -- reading ---------------------------------------------------------------------------

    async def read_page(
        self,
        after_seq: int = 0,
        *,
        kinds: Iterable[str] | None = None,
        key: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        origin_prefix: str | None = None,
    ) -> Page:
        """Stored events with seq > after_seq, oldest first (or newest first), optionally
        filtered (by kinds, key, and `origin_prefix`: origins that start with it), and the
        log's newest seq in the same read (see Page).

        Quarantined rows are left out and the page filled up past them, so a page shorter
        than `limit` still means the read reached the end.
        """
        kind_list = None if kinds is None else list(kinds)
        if kind_list is not None and not kind_list:
            return Page([], await self.recorder.last_seq())
        want = limit
        while True:
            extra = {} if origin_prefix is None else {"origin_prefix": origin_prefix}
            page = await self.recorder.select(after_seq, kinds=kind_list, key=key, limit=want,
                                              newest_first=newest_first, **extra)
            if not page.unreadable:
                return page
            for row in page.unreadable:
                await self._leave_out(row)
            rows = len(page.events) + len(page.unreadable)
            if limit is None or want is None or len(page.events) >= limit or rows < want:
                return Page(page.events[:limit], page.last_seq)
            want = limit + len(page.unreadable)

    async def pages(
        self, after_seq: int = 0, *, kinds: Iterable[str] | None = None, limit: int = 5_000,
    ) -> AsyncIterator[Page]:
        """Pages of up to `limit` events after `after_seq`, oldest first, until a page is
        short: the last one's `last_seq` is the log's head as that read saw it."""
        kind_list = None if kinds is None else list(kinds)
        while True:
            page = await self.read_page(after_seq, kinds=kind_list, limit=limit)
            yield page
            if len(page.events) < limit:
                return
            after_seq = page.events[-1].seq

    async def read(
        self,
        after_seq: int = 0,
        *,
        kinds: Iterable[str] | None = None,
        key: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        origin_prefix: str | None = None,
    ) -> list[Event]:
        """Stored events with seq > after_seq, oldest first (or newest first: `limit=1`
        gives the latest), optionally filtered (`origin_prefix`: origins that start with
        it, as "executor:" matches every executor)."""
        if kinds is not None and not (kinds := list(kinds)):
            return []
        page = await self.read_page(after_seq, kinds=kinds, key=key, limit=limit,
                                    newest_first=newest_first, origin_prefix=origin_prefix)
        return page.events

    async def read_rows(
        self,
        after_seq: int = 0,
        *,
        kinds: Iterable[str] | None = None,
        key: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[Event | UnreadableEvent]:
        """Like `read`, but every stored row, quarantined or not: a row whose data cannot be
        decoded comes as an UnreadableEvent (with the decoder's reason) in its place."""
        kind_list = None if kinds is None else list(kinds)
        if kind_list is not None and not kind_list:
            return []
        page = await self.recorder.select(after_seq, kinds=kind_list, key=key, limit=limit,
                                          newest_first=newest_first)
        rows: list[Event | UnreadableEvent] = [*page.events, *page.unreadable]
        rows.sort(key=lambda row: row.seq, reverse=newest_first)
        return rows

    # -- quarantine --------------------------------------------------------------------------

    async def quarantine(self, seq: int, reason: str, *, origin: str = "human"
                         ) -> Event | UnreadableEvent:
        """Mark the unreadable row `seq` as quarantined, so every read leaves it out, and
        return the `event-quarantined` event (the earlier one if it already was, as an
        UnreadableEvent should that one be unreadable too).

        InvalidEvent when there is no row `seq` or it can be read; StoreReadOnly on a store
        opened read-only; NotAuthorized unless a person holds this handle.
        """
        await self.require_person(QUARANTINED, f"event:{seq}", f"quarantine event #{seq}")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            raise InvalidEvent(f"quarantine: {seq!r} is not a seq (an int >= 1)")
        page = await self.recorder.select(seq - 1, limit=1)
        row = next((r for r in page.unreadable if r.seq == seq), None)
        if row is None:
            if page.events and page.events[0].seq == seq:
                raise InvalidEvent(f"event #{seq} can be read: only a row whose data cannot "
                                   "be decoded is quarantined")
            raise InvalidEvent(f"there is no event #{seq} (the log ends at #{page.last_seq})")
        return await self._quarantine(row, reason, origin)

    async def _quarantine_of(self, row: UnreadableEvent) -> Event | UnreadableEvent | None:
        """The `event-quarantined` event naming `row`, if any (stored under the row's key)."""
        page = await self.recorder.select(0, kinds=[QUARANTINED], key=row.key)
        for event in page.events:
            if isinstance(event.data, dict) and event.data.get("seq") == row.seq:
                return event
        # An unreadable quarantine record of this key may be the one: count it as such.
        return next((other for other in page.unreadable if other.seq != row.seq), None)

    async def _quarantine(self, row: UnreadableEvent, reason: str, origin: str
                          ) -> Event | UnreadableEvent:
        found = await self._quarantine_of(row)
        if found is None:
            draft = EventDraft(QUARANTINED, row.key,
                               {"seq": row.seq, "kind": row.kind, "key": row.key,
                                "version": row.version, "reason": reason},
                               origin=origin, idem=f"{QUARANTINED}:{row.seq}")
            try:
                result = await self.append([draft])
            except IdempotencyConflict:  # quarantined meanwhile, for another reason
                found = await self._quarantine_of(row)
                if found is None:  # the idempotency key names some other event
                    raise
            else:
                found = result.events[0]
                if not result.replayed:
                    log.warning("pulse: %s: event #%d (%s on %r) cannot be read (%s); "
                                "quarantined by event #%d", self.recorder.location, row.seq,
                                row.kind, row.key, row.reason, found.seq)
        self._quarantined.add(row.seq)
        return found

    async def _leave_out(self, row: UnreadableEvent) -> None:
        """Let a read skip the unreadable `row`: it is quarantined, or (writable) becomes so
        now; otherwise EventUnreadable."""
        if row.seq in self._quarantined:
            return
        if await self._quarantine_of(row) is not None:
            self._quarantined.add(row.seq)
            return
        if self.read_only:
            raise EventUnreadable(row.seq, self.recorder.location,
                                  f"{row.kind} on {row.key!r}: {row.reason}")
        if self.principal.kind == "agent":  # an agent's channel skips it, an engine records it
            self._quarantined.add(row.seq)
            return
        await self._quarantine(row, row.reason, "engine:event-log")

    async def head(self, key: str) -> int:
        """The current version of `key` (0 when it has no events)."""
        return await self.recorder.head(key)

    async def last_seq(self) -> int:
        """The seq of the newest stored event (0 for an empty log)."""
        return await self.recorder.last_seq()

    def last_seq_blocking(self) -> int | None:
        """`last_seq` read on the calling thread, for a caller already on a worker thread
        (never on the event loop); None where the backend reads only asynchronously
        (PostgreSQL): use `last_seq` there."""
        return self.recorder.last_seq_blocking()

    async def changes(
        self,
        after_seq: int = 0,
        *,
        kinds: Iterable[str] | None = None,
        poll_interval: float = 1.0,
        batch: int = 1000,
    ) -> AsyncIterator[Event]:
        """Every event after `after_seq`, then each new one as it commits, forever.

        Commits through this store wake the cursor at once; commits by other processes do
        too where the recorder listens for them (PostgreSQL), and are otherwise seen within
        `poll_interval` seconds (where it listens, the cursor still reads every
        SAFETY_POLL_S seconds, should a wake be lost). A read the store refuses as
        unavailable (a server restarting, a disk failing) is logged and made again, from the
        same event, until it succeeds (CURSOR_RETRY): nothing is skipped or yielded twice.
        """

        kind_list = list(kinds) if kinds is not None else None
        signal = self.subscribe()
        if self._listening:
            poll_interval = max(poll_interval, SAFETY_POLL_S)
        try:
            cursor = after_seq
            failures = 0
            while True:
                signal.clear()
                try:
                    page = await self.read_page(cursor, kinds=kind_list, limit=batch)
                except StoreUnavailable as exc:  # a server restarting, a disk failing: wait
                    failures += 1
                    if failures == 1:
                        log.warning("pulse: %s: a cursor cannot read the log (%s); it reads "
                                    "again from event #%d until it can", self.recorder.location,
                                    exc, cursor)
                    await wait_signal(signal, min(poll_interval,
                                                  CURSOR_RETRY.delay_ms(failures) / 1000))
                    continue
                if failures:
                    log.info("pulse: %s: a cursor reads the log again after %d failed reads",
                             self.recorder.location, failures)
                    failures = 0
                for event in page.events:
                    cursor = event.seq
                    yield event
                if len(page.events) == batch:
                    continue
                # Every event up to `last_seq` was visible to that read: skip filtered ones.
                cursor = max(cursor, page.last_seq)
                await wait_signal(signal, poll_interval)
        finally:
            self.unsubscribe(signal)

    # -- notification and lifecycle ----------------------------------------------------------

    def subscribe(self) -> asyncio.Event:
        """An asyncio.Event set after every append through this store that wrote something,
        and, where the recorder listens (the first subscribe asks it to), whenever another
        process may have committed; clear it after waking."""
        if self._listening is None:
            self._listening = self.recorder.listen(self._wake)
        signal = asyncio.Event()
        self._signals.add(signal)
        return signal

    @property
    def wakes_across_processes(self) -> bool:
        """Whether subscribers are woken by other processes' commits too (PostgreSQL's
        LISTEN), known from the first `subscribe` on."""
        return bool(self._listening)

    def unsubscribe(self, signal: asyncio.Event) -> None:
        """Stop setting a signal returned by `subscribe`."""
        self._signals.discard(signal)

    def exclusive(self, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Held by at most one holder at a time among everything sharing this log (every
        process and host on a PostgreSQL database; this store's users on SQLite). Should a
        PostgreSQL lock's session drop while inside, each append inside the block and
        leaving it raise LockLost: another holder may be inside."""
        return self.recorder.exclusive(name)

    async def close(self) -> None:
        """Finish pending appends and release the backend (and the element keys)."""
        try:
            await self.recorder.close()
        finally:
            if self.keys is not None:
                self.keys.close()
