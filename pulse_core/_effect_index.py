"""The index of unfinished effects: folded from the log, paged, checkpointed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from pulse_core._effects import EFFECT_KINDS, EffectEntry, EffectStatus, advance
from pulse_core._events import Event
from pulse_core._projector import (
    INLINE_FOLD,
    discard_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from pulse_core.store._base import EventStore

_CHECKPOINT = "executor-loop"
_CHECKPOINT_VERSION = 1
PAGE = 5_000
CHECKPOINT_EVERY = 10_000


class EffectIndex:
    """Every effect not yet acked or finally failed, by id, as of `cursor` in the log.

    With `checkpoints`, the index starts from its last checkpoint and is saved again once the
    log has moved `CHECKPOINT_EVERY` events past it (and on `checkpoint(force=True)`).
    """

    def __init__(self, store: EventStore, checkpoints: Path | None) -> None:
        self.store = store
        self.checkpoints = checkpoints
        self.entries: dict[str, EffectEntry] = {}
        self.cursor = 0
        self._saved_cursor = 0
        self._lock = asyncio.Lock()
        if checkpoints is not None:
            loaded = load_checkpoint(checkpoints, _CHECKPOINT, _CHECKPOINT_VERSION,
                                     dict[str, EffectEntry])
            if loaded is not None:
                self.cursor = self._saved_cursor = loaded[0]
                self.entries = loaded[1]

    async def refresh(self) -> None:
        """Fold every effect event committed since the last refresh.

        A cursor past the log's newest seq (a checkpoint of more log than there is) is
        discarded and the index rebuilt from the start of the log.
        """
        async with self._lock:
            head = await self._fold_new()
            if head < self.cursor:
                ahead = self.cursor
                self.entries.clear()  # in place: the executor loop holds this dict
                self.cursor = self._saved_cursor = 0
                await discard_checkpoints(self.store, self.checkpoints, {_CHECKPOINT: ahead},
                                          head)
                await self._fold_new()

    async def _fold_new(self) -> int:
        """Fold the effect events after `cursor`; the log's newest seq as the last read saw
        it."""
        head = 0
        async for page in self.store.pages(self.cursor, kinds=EFFECT_KINDS, limit=PAGE):
            if len(page.events) > INLINE_FOLD:
                changes = await asyncio.to_thread(self._fold_apart, page.events)
            else:
                changes = {}
                for event in page.events:
                    changes[event.key] = advance(
                        changes[event.key] if event.key in changes
                        else self.entries.get(event.key), event)
            for key, entry in changes.items():
                if entry is None:
                    self.entries.pop(key, None)
                else:
                    self.entries[key] = entry
            # Every event up to the read's head was seen (the last page's head ends it).
            self.cursor = max(self.cursor, page.last_seq if len(page.events) < PAGE
                              else page.events[-1].seq)
            head = page.last_seq
        return head

    def _fold_apart(self, events: list[Event]) -> dict[str, EffectEntry | None]:
        """In a worker thread: the entries `events` change, folded on copies, so the index
        the event loop reads meanwhile is never half updated."""
        changes: dict[str, EffectEntry | None] = {}
        for event in events:
            if event.key in changes:
                entry = changes[event.key]
            else:
                current = self.entries.get(event.key)
                entry = None if current is None else msgspec.structs.replace(current)
            changes[event.key] = advance(entry, event)
        return changes

    def dedup_keys(self) -> frozenset[str]:
        """Dedup keys of every unfinished effect."""
        return frozenset(entry.dedup for entry in self.entries.values())

    def next_due(self, now: int) -> int | None:
        """The soonest retry or lease expiry after `now` (clock ms), if any."""
        due = [e.retry_at for e in self.entries.values() if e.status is EffectStatus.RETRYING]
        due += [e.lease_until for e in self.entries.values()
                if e.status is EffectStatus.EXECUTING]
        return min((d for d in due if d > now), default=None)

    def checkpoint(self, force: bool = False) -> None:
        """Save the index (blocking) when due, or now with `force`."""
        if self.checkpoints is None:
            return
        if force or self.cursor - self._saved_cursor >= CHECKPOINT_EVERY:
            save_checkpoint(self.checkpoints, _CHECKPOINT, _CHECKPOINT_VERSION, self.cursor,
                            self.entries)
            self._saved_cursor = self.cursor
