"""A kept recall: a Recaller folds the log once and then only what was appended since, and
selects in a thread of its own (docs/memory.md, "Recall")."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from pulse_core._pmap import PersistentMap
from pulse_core._projector import Projector
from pulse_core._recall import (
    NOTHING_OBSERVED,
    Candidates,
    Recalled,
    RecallQuery,
    query_words,
    select,
)
from pulse_core._waits import JobThread
from pulse_core.store import EventStore

if TYPE_CHECKING:
    from pulse_core.maintenance import ElementsState
    from pulse_core.memory import IdentityMemory

T = TypeVar("T")

INLINE_SELECTION = 0.005
"""How long the loop's thread waits, blocked, for a kept Recaller's selection before it
awaits it (seconds): keys.db is still read in the Recaller's thread, never on the loop's."""


class Folded(NamedTuple):
    """What a Recaller folded: the memory and elements states, the imports a person
    verified, the log's seq they reflect, and the store's `wakes` before the fold."""

    seq: int
    wakes: int
    memory: PersistentMap[str, IdentityMemory]
    elements: ElementsState
    verified: PersistentMap[str, bool]


class Recaller:
    """Recall that keeps its fold: each call folds only the events appended since the last
    one (the first folds the whole log); where the store reads its newest seq blocking
    (SQLite), a call that finds the log where its fold left it selects at once, in the
    same thread. Selections run in a thread of the Recaller's own (started at the first
    recall, ended when the Recaller is dropped), or beside it in a pool's while it is busy
    with another. Keep one per store, used from one event loop, for repeated recalls (a
    turn's offer, a server's recall tool); `recall(store, query)` is a one-shot
    Recaller. `import_origins`: the writers whose memory came from outside
    (pulse_core.maintenance.IMPORT_ORIGINS by default; a home's maintenance settings may name
    others, `imports.origins`), ranked as a background writer's until a person verifies
    it."""

    def __init__(self, store: EventStore, *, import_origins: Iterable[str] | None = None
                 ) -> None:
        from pulse_core.maintenance import IMPORT_ORIGINS, MemoryElements, VerifiedImports
        from pulse_core.memory import Memory

        self.store = store
        self.import_origins = tuple(IMPORT_ORIGINS if import_origins is None
                                    else import_origins)
        self._projector = Projector(store, [Memory(), MemoryElements(), VerifiedImports()])
        self._folding = asyncio.Lock()
        self._observed = NOTHING_OBSERVED
        self._candidates = Candidates()
        self._folded: Folded | None = None  # kept when the store reads its seq blocking
        self._thread: JobThread | None = None
        self._selecting = False  # the thread runs a selection
        self._slow = False  # the thread's last selection took longer than INLINE_SELECTION

    async def _off_loop(self, fn: Callable[[], T], *, wait: bool = False) -> T:
        """`fn()` in the Recaller's thread, or in the default pool's while that is busy (a
        recall never waits for another's selection); `wait`: the loop's thread waits for it
        at most INLINE_SELECTION, unless the thread's last selection was slower."""
        if self._selecting:
            return await asyncio.to_thread(fn)
        if self._thread is None:
            self._thread = JobThread("pulse-recall")
            weakref.finalize(self, self._thread.stop_soon)

        def timed() -> T:
            started = time.perf_counter()
            try:
                return fn()
            finally:
                self._slow = time.perf_counter() - started > INLINE_SELECTION

        self._selecting = True
        try:
            if wait and not self._slow:
                return await self._thread.call_waiting(timed, INLINE_SELECTION)
            return await self._thread.call(timed)
        finally:
            self._selecting = False

    async def recall(self, query: RecallQuery) -> list[Recalled]:
        """As `recall(self.store, query)`; concurrent calls fold one at a time."""
        query_words(query)
        kept = self._folded
        # one hop: the log's seq is read where the selection runs (an append through this
        # store since the fold sends the call to fold again at once)
        if kept is not None and kept.wakes == self.store.wakes:
            found = await self._off_loop(lambda: self._select_unless_moved(kept, query),
                                         wait=True)
            if found is not None:
                return found
        async with self._folding:
            wakes = self.store.wakes
            states = await self._projector.catch_up()
            folded = Folded(self._projector.seq, wakes, states["memory"], states["elements"],
                            states["verified-imports"])
        selected, keep = await self._off_loop(lambda: self._select_new(folded, query))
        if keep and (self._folded is None or self._folded.seq <= folded.seq):
            self._folded = folded
        return selected

    def _select_unless_moved(self, folded: Folded, query: RecallQuery
                             ) -> list[Recalled] | None:
        """The recall of `query` over `folded` while the log holds nothing newer; None
        once it does."""
        if self.store.last_seq_blocking() != folded.seq:
            return None
        return self._select(folded, query)

    def _select_new(self, folded: Folded, query: RecallQuery) -> tuple[list[Recalled], bool]:
        """The recall of `query` over a fold just made, and whether to keep that fold for
        `_select_unless_moved` (the store reads its seq blocking)."""
        return self._select(folded, query), self.store.last_seq_blocking() is not None

    def _select(self, folded: Folded, query: RecallQuery) -> list[Recalled]:
        # any (memory, identities) pair is consistent: a race only repeats a diff
        self._observed = self._observed.of(folded.memory)
        return select(folded.memory, folded.elements, query, self.store.keys,
                      observed=self._observed, candidates=self._candidates,
                      verified=folded.verified,
                      import_origins=self.import_origins)


async def recall(store: EventStore, query: RecallQuery, *,
                 import_origins: Iterable[str] | None = None) -> list[Recalled]:
    """The elements the agent recalls for `query`, best first, at most `query.limit`.

    Ranked by the writer's authority (a person's word first), then confidence x memory
    strength (a reinforced element outranks a decayed one), then the newest. Archived
    elements are left out unless `query.include_archived`; tombstoned, purged, forgotten,
    quarantined, retracted and resolved ones never appear. A legal hold changes nothing here:
    it keeps an element from being purged, and the element is recalled as its stage says.
    Text is searched in the keys' FTS5 index and opened with the store's element keys (a
    purged element's text is gone).

    An imported element (its writer one of `import_origins`, as for Recaller) ranks as a
    background writer's until a person verifies it, then as its writer's.

    RecallRefused names a malformed field; UnknownIdentity an identity with no memory.
    Folds the memory and the elements from the whole log each call (a Recaller keeps its
    fold between calls).
    """
    return await Recaller(store, import_origins=import_origins).recall(query)
