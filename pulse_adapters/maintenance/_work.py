"""What one cycle has written, as the log holds it (CycleTally).

Every event a cycle writes has as its `cause` the seq of the cycle's `activity-started`. Its
report counts what the log holds under that cause (read once; the sweep's own appends are
counted from their results), and a resumed attempt starts its budgets from there: an
attempt cut short (the engine killed, the attempt timed out, its lease taken over while it
still ran) counts in the report and spends the cycle's budgets, never an attempt's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import msgspec

from pulse_adapters.maintenance._context import REVIEW_DERIVED
from pulse_adapters.maintenance._settings import ORIGIN
from pulse_core import Event
from pulse_core.store import EventStore

COUNTED = {
    "element-archived": "archived",
    "derivation-stale": "stale_flagged",
    "sleep-task-completed": "sleep_tasks_completed",
    "sleep-task-failed": "sleep_tasks_failed",
    "watch-fired": "watches_fired",
    "watch-satisfied": "watches_satisfied",
    "insight-recorded": "semantic_consolidations",
    "skill-verdict": "skill_verdicts",
    "activity-cancelled": "abandoned_cycles_closed",
    "self-model-refreshed": "self_model_refreshed",
    "import-flagged": "imports_flagged",
}
"""The report's change counter each kind a cycle writes counts one for (decays, review
tasks and overdue notices are counted from their payloads)."""

REVIEWED = ("decayed", "archived", "stale_flagged")
"""Changes that each reviewed an element: what a resumed cycle's earlier attempts reviewed
at least."""


class CycleWork(msgspec.Struct, frozen=True, kw_only=True):
    """What the log holds of one cycle: events written, appends (distinct transactions),
    the change counters, and the elements and sleep tasks those writes reviewed."""

    writes: int = 0
    transactions: int = 0
    changes: dict[str, int] = {}
    reviewed: int = 0


def _count(changes: Counter[str], event: Event) -> None:
    data = event.data if isinstance(event.data, dict) else {}
    if event.kind == "memory-metabolized":
        changes["decayed"] += len(data.get("strengths") or ())
    elif event.kind == "sleep-task-created":
        if data.get("task_class") == REVIEW_DERIVED:
            changes["review_tasks_created"] += 1
    elif event.kind == "observation-recorded":
        if data.get("key") == "commitment-overdue":
            changes["overdue_surfaced"] += 1
    elif event.kind == "sleep-task-claimed":
        changes["sleep_tasks_claimed"] += 1
    elif event.kind in COUNTED:
        changes[COUNTED[event.kind]] += 1


class CycleTally:
    """The work of the cycle whose activity-started is at seq `began_seq`, as the log holds
    it: every event from maintenance's origin with that cause, however many attempts wrote
    them. Each event is counted once: `current()` reads only the events after the last one
    counted, and `take()` counts an append's events from its result, not read back."""

    def __init__(self, store: EventStore, began_seq: int) -> None:
        self.store = store
        self.began_seq = began_seq
        self.cursor = began_seq  # every event up to here is counted
        self._writes = 0
        self._transactions: set[str] = set()
        self._changes: Counter[str] = Counter()

    async def current(self) -> CycleWork:
        """The cycle's work in the log as it is now."""
        async for page in self.store.pages(self.cursor):
            self._count(page.events)
        return self._work()

    async def take(self, events: Sequence[Event]) -> None:
        """Count `events`, one append's result (consecutive seqs), after reading only the
        events before them not yet counted; anything else is left to `current()`."""
        if not events or events[0].seq <= self.cursor or any(
                e.seq != events[0].seq + n for n, e in enumerate(events)):
            return
        first = events[0].seq
        if first - 1 > self.cursor:  # the page fills up past quarantined rows: cut it
            page = await self.store.read_page(self.cursor, limit=first - 1 - self.cursor)
            self._count([e for e in page.events if e.seq < first])
        self._count(events)

    def _count(self, events: Iterable[Event]) -> None:
        for event in events:
            if event.seq <= self.cursor:
                continue
            self.cursor = event.seq
            if event.cause != self.began_seq or event.origin != ORIGIN:
                continue
            self._writes += 1
            self._transactions.add(event.tx)
            _count(self._changes, event)

    def _work(self) -> CycleWork:
        changes = Counter(self._changes)
        claimed = changes.pop("sleep_tasks_claimed", 0)
        return CycleWork(writes=self._writes, transactions=len(self._transactions),
                         changes={k: v for k, v in sorted(changes.items()) if v},
                         reviewed=claimed + sum(changes[k] for k in REVIEWED))
