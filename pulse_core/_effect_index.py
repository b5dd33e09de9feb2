"""The index of unfinished effects: folded from the log, paged, checkpointed.

It forgets an effect once it is finished; an operator's retry brings one back, folded again
from its own events (`effect-retried` is the one event that can follow a finish)."""

from __future__ import annotations

import asyncio
import functools
import heapq
from collections.abc import Callable
from pathlib import Path

import msgspec

from pulse_core._effects import EFFECT_KINDS, EffectEntry, EffectStatus, advance, fold_effect
from pulse_core._events import QUARANTINED, Event
from pulse_core._projector import (
    INLINE_FOLD,
    discard_checkpoints,
    foreign_checkpoints,
    id_at,
    load_checkpoint,
    save_checkpoint,
)
from pulse_core.store import EventStore

_CHECKPOINT = "executor-loop"
_CHECKPOINT_VERSION = 3  # 2: EffectEntry.attempts_before_retry; 3: lease_ms
PAGE = 5_000
CHECKPOINT_EVERY = 10_000
CLAIMED = "effect-executing"
FOLDED = EFFECT_KINDS | {QUARANTINED}
"""An effect's own events, and a quarantine of one (it moves the effect's version on)."""


class EffectIndex:
    """Every effect not yet acked, finally failed or cancelled, by id, as of `cursor` in the
    log.

    With `checkpoints`, the index starts from its last checkpoint and is saved again once the
    log has moved `CHECKPOINT_EVERY` events past it (and on `checkpoint(force=True)`).
    """

    def __init__(self, store: EventStore, checkpoints: Path | None) -> None:
        self.store = store
        self.checkpoints = checkpoints
        self.entries: dict[str, EffectEntry] = {}
        #: ids whose entry changed, came or went since the last `take_changed`
        self.changed: set[str] = set()
        #: the stamp (ms) of the newest claim of each (effect type, owner) folded since the
        #: last `take_claims`: one item an owner, however many claims it made
        self.claims: dict[tuple[str, str], int] = {}
        self._timers: list[tuple[int, str]] = []  # (retry, id); stale ones too
        self.cursor = 0
        self._saved_cursor = 0
        self._lock = asyncio.Lock()
        self._unverified: tuple[int, str] | None = None  # a loaded checkpoint, not yet checked
        if checkpoints is not None:
            loaded = load_checkpoint(checkpoints, _CHECKPOINT, _CHECKPOINT_VERSION,
                                     dict[str, EffectEntry])
            if loaded is not None:
                self.cursor = self._saved_cursor = loaded.seq
                self.entries = loaded.state
                self.changed.update(self.entries)
                for entry in self.entries.values():
                    self._time(entry)
                self._unverified = (loaded.seq, loaded.at)

    async def refresh(self) -> None:
        """Fold every effect event committed since the last refresh.

        At the first refresh, a checkpoint this log does not bear out (it ends before the
        checkpoint's seq, or holds another event there) is discarded and the index rebuilt
        from the start of the log.
        """
        async with self._lock:
            if self._unverified is not None:
                foreign = await foreign_checkpoints(self.store, {_CHECKPOINT: self._unverified})
                self._unverified = None
                if foreign:
                    self.changed.update(self.entries)
                    self.entries.clear()  # in place: the executor loop holds this dict
                    self.cursor = self._saved_cursor = 0
                    await discard_checkpoints(self.store, self.checkpoints, foreign)
            await self._fold_new()

    async def _fold_new(self) -> int:
        """Fold the effect events after `cursor`; the log's newest seq as the last read saw
        it."""
        head = 0
        async for page in self.store.pages(self.cursor, kinds=FOLDED, limit=PAGE):
            # Every event up to the read's head was seen (the last page's head ends it).
            end = page.last_seq if len(page.events) < PAGE else page.events[-1].seq
            # Read before folding: the inline fold changes entries in place, and the loop
            # must not see them between that and the removal of finished ones.
            revived = {key: await self._refold(key, end)
                       for key in {e.key for e in page.events if e.kind == "effect-retried"}}
            if len(page.events) > INLINE_FOLD:
                changes, claims = await asyncio.to_thread(self._fold_apart, page.events)
            else:
                changes, claims = self._fold(page.events, self.entries.get)
            self.claims.update(claims)
            changes.update(revived)
            self.changed.update(changes)
            for key, entry in changes.items():
                if entry is None:
                    self.entries.pop(key, None)
                else:
                    self.entries[key] = entry
                    self._time(entry)
            self.cursor = max(self.cursor, end)
            head = page.last_seq
        return head

    async def _refold(self, key: str, end: int) -> EffectEntry | None:
        """Effect `key` as its events up to seq `end` leave it (None once finished): a retry
        follows a finish, which this index had already forgotten. Every event of the key is
        read, a note filed under it too, so the entry's version is the key's."""
        entry: EffectEntry | None = None
        for event in await self.store.read(key=key):
            if event.seq > end:
                break
            entry = fold_effect(entry, event)
        return None if entry is None or entry.finished else entry

    def _fold_apart(self, events: list[Event]
                    ) -> tuple[dict[str, EffectEntry | None], dict[tuple[str, str], int]]:
        """In a worker thread: `_fold` on copies of the entries, so the index the event loop
        reads meanwhile is never half updated."""
        def copy(key: str) -> EffectEntry | None:
            current = self.entries.get(key)
            return None if current is None else msgspec.structs.replace(current)
        return self._fold(events, copy)

    @staticmethod
    def _fold(events: list[Event], entry_of: Callable[[str], EffectEntry | None]
              ) -> tuple[dict[str, EffectEntry | None], dict[tuple[str, str], int]]:
        """The entries `events` change (each first taken from `entry_of`), and the stamp of
        the newest claim among them of each (effect type, owner)."""
        changes: dict[str, EffectEntry | None] = {}
        claims: dict[tuple[str, str], int] = {}
        for event in events:
            key = event.key
            entry = advance(changes[key] if key in changes else entry_of(key), event)
            changes[key] = entry
            if event.kind == CLAIMED and entry is not None:
                claims[entry.tag, entry.owner] = event.ts
        return changes, claims

    def take_claims(self) -> dict[tuple[str, str], int]:
        """The stamp (ms) of the newest claim of each (effect type, owner) folded since the
        last call."""
        claims, self.claims = self.claims, {}
        return claims

    def take_changed(self) -> set[str]:
        """The ids whose entry changed, came or went since the last call."""
        changed, self.changed = self.changed, set()
        return changed

    def dedup_keys(self, host: str = "") -> frozenset[str]:
        """Dedup keys of every unfinished effect that may run on `host` ('': every one)."""
        return frozenset(entry.dedup for entry in self.entries.values()
                         if not host or entry.host in ("", host))

    def next_due(self, now: int) -> int | None:
        """The soonest retry after `now` (clock ms), if any."""
        timers = self._timers  # it runs at every wake of the loop: no pass over every entry
        while timers:
            due, effect_id = timers[0]
            entry = self.entries.get(effect_id)
            if due > now and entry is not None and _due(entry) == due:
                return due
            heapq.heappop(timers)  # past, finished, or moved on since
        return None

    def _time(self, entry: EffectEntry) -> None:
        due = _due(entry)
        if due is not None:
            heapq.heappush(self._timers, (due, entry.id))

    async def checkpoint(self, force: bool = False) -> bool:
        """Save the index when due, or now with `force` (then in a thread: nothing folds into
        the index while the loop drains); whether it was saved now."""
        if self.checkpoints is None:
            return False
        if not force and self.cursor - self._saved_cursor < CHECKPOINT_EVERY:
            return False
        cursor = self.cursor
        at = await id_at(self.store, cursor)
        if self.cursor != cursor:  # folded on meanwhile: saved at a later call
            return False
        if force:
            await asyncio.to_thread(functools.partial(
                save_checkpoint, self.checkpoints, _CHECKPOINT, _CHECKPOINT_VERSION, cursor,
                self.entries, at=at))
        else:  # on the loop: a thread could see the index change under it
            save_checkpoint(self.checkpoints, _CHECKPOINT, _CHECKPOINT_VERSION, cursor,
                            self.entries, at=at)
        self._saved_cursor = cursor
        return True


def _due(entry: EffectEntry) -> int | None:
    """When `entry` is next due to retry (None: it is not retrying). A lease's end is each
    loop's own count (pulse_core._lease.Leases), never a time on another host's clock."""
    return entry.retry_at if entry.status is EffectStatus.RETRYING else None


async def foreign_head(store: EventStore, key: str, version: int) -> int | None:
    """The version effect `key` is at if every event after `version` is foreign to the
    effect (a note filed under its id: the index folds none of them), so a write that
    expected `version` may expect that instead; None when the effect itself moved on."""
    later = [e for e in await store.read(key=key) if e.version > version]
    if not later or any(e.kind in FOLDED for e in later):
        return None
    return later[-1].version
