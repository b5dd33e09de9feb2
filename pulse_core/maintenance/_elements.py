"""Memory elements: every record of an identity as one maintainable unit, folded from the log.

An element is one memory record (an exchange, a state item, an observation, an insight, a
commitment, an assertion...) with what maintenance needs beside it: its memory strength
(accessibility, never truth), its salience (protection from decay), its retention stage
(active -> archived -> tombstoned -> purged), a legal hold, a stale flag and its lineage
(derived_from, consolidated_to, corrects, corrected_by, referenced_by). Elements carry no
confidence at all: truth lives in the state items of pulse_core/memory.py and decay cannot
reach it. The kinds that change elements are in _element_kinds.py, the queries over the folded
state in _element_queries.py.

Every element event is keyed `identity:<id>`, like the memory events, so one expected
version guards all of an identity's elements; `ElementsState.versions` holds that version.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pulse_core._events import Event
from pulse_core._projector import Projector
from pulse_core._snapshot import Projection
from pulse_core.maintenance._element_fold import fold_event, fold_events
from pulse_core.maintenance._element_state import (
    ElementsState,
)
from pulse_core.store import EventStore


class MemoryElements(Projection[ElementsState]):
    """Every memory record as an element (sees every event, for versions and payload purges)."""

    name = "elements"
    kinds = None
    version = 3  # 2: pending references, foreign digests, payload purges, checked fold;
    # 3: an element checkpointed as an array (half the bytes, a third of the encoding)

    def initial(self) -> ElementsState:
        return ElementsState()

    def apply(self, state: ElementsState, event: Event) -> ElementsState:
        return fold_event(state, event)

    def apply_all(self, state: ElementsState, events: Sequence[Event]) -> ElementsState:
        return fold_events(state, events)


class ElementsReader:
    """The elements' current form, folded incrementally from where the last read left off.

    Every maintenance step reads through one of these before it writes, so the versions it
    expects are as fresh as the log it has seen (keep one reader to fold only what is new).
    It is a Projector of MemoryElements alone, so a long page is folded in a worker thread and
    the event loop never stalls. With `checkpoints` (a folder), the fold starts from the
    checkpoint saved there and folds only the log's tail, and `checkpoint()` saves it again: a
    restarted engine never folds the whole log. A checkpoint of another log (a home restored
    from a backup) or of an older fold is discarded and the fold starts from seq 0.
    """

    def __init__(self, store: EventStore, *, page: int = 5_000,
                 checkpoints: Path | None = None) -> None:
        self.store = store
        self.checkpoints = checkpoints
        self._projector = Projector(store, [MemoryElements()], page=page,
                                    checkpoints=checkpoints)

    @property
    def cursor(self) -> int:
        """The seq the fold has reached (the log's newest, as the last read saw it; before
        the first read, the seq of the checkpoint it starts from)."""
        return self._projector.seq

    async def current(self) -> ElementsState:
        """The state folded through the log's newest event."""
        state: ElementsState = (await self._projector.catch_up())[MemoryElements.name]
        return state

    async def take(self, events: Sequence[Event]) -> ElementsState | None:
        """Fold `events`, just appended, when nothing else came before them since the last
        read (they are the log's next events): the read back they save. The state after
        them, or None when they were not folded (the next `current()` reads them with the
        rest)."""
        if not await self._projector.take(events):
            return None
        state: ElementsState = self._projector.states[MemoryElements.name]
        return state

    async def checkpoint(self) -> None:
        """Save the fold to `checkpoints` when it moved since the last save (nothing without
        a folder). OSError when the folder cannot be written."""
        if self.checkpoints is not None:
            await self._projector.checkpoint()
