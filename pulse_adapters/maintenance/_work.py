"""What one cycle has written, read from the log.

Every event a cycle writes has as its `cause` the seq of the cycle's `activity-started`. Its
report counts what the log holds under that cause, and a resumed attempt starts its budgets
from there: an attempt cut short (the engine killed, the attempt timed out, its lease taken
over while it still ran) counts in the report and spends the cycle's budgets, never an
attempt's.
"""

from __future__ import annotations

from collections import Counter

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


async def cycle_work(store: EventStore, began_seq: int) -> CycleWork:
    """The work of the cycle whose activity-started is at seq `began_seq`: every event from
    maintenance's origin with that cause, however many attempts wrote them."""
    writes = 0
    transactions: set[str] = set()
    changes: Counter[str] = Counter()
    async for page in store.pages(began_seq):
        for event in page.events:
            if event.cause != began_seq or event.origin != ORIGIN:
                continue
            writes += 1
            transactions.add(event.tx)
            _count(changes, event)
    claimed = changes.pop("sleep_tasks_claimed", 0)
    return CycleWork(writes=writes, transactions=len(transactions),
                     changes={k: v for k, v in sorted(changes.items()) if v},
                     reviewed=claimed + sum(changes[k] for k in REVIEWED))
