"""What the Reviewer page keeps folded from the log as it grows: the newest review cycles
(`awareness-cycle` records), the reviewer's journal (`awareness-journal`), and per-day
totals of cycles, outcomes, model calls, inference time and verbs. Like the LogBook it reads
only its kinds, only what was appended since its last read, in bounded pages.

Days are UTC days, as the reviewer's own daily budgets count them
(pulse_adapters.awareness.ledger.DAY_MS).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import msgspec

from pulse_adapters.awareness.ledger import DAY_MS, CycleRecord
from pulse_adapters.web._folding import LogFold
from pulse_core import Event, EventStore, InvalidEvent

CYCLE, JOURNAL = "awareness-cycle", "awareness-journal"
KINDS = (CYCLE, JOURNAL)
CYCLES_KEPT = 200
"""The newest cycles the page can list."""
JOURNAL_KEPT = 50
DAYS_KEPT = 30
TOKEN_FIELDS = ("prompt_tokens", "completion_tokens")
"""Token counts a cycle record may carry (those the model server reported for its calls)."""


class DayTally(msgspec.Struct):
    """One UTC day of reviews: how many cycles and with which outcome, the model calls they
    made and the inference time they took, the verbs accepted and rejected, and the tokens
    reported (None while no cycle of the day recorded token counts)."""

    day: str
    cycles: int = 0
    outcomes: dict[str, int] = msgspec.field(default_factory=dict)
    model_calls: int = 0
    inference_ms: int = 0
    accepted: int = 0
    rejected: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def _day_name(day: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(day * DAY_MS / 1000))


def cycle_json(event: Event, record: CycleRecord) -> dict[str, Any]:
    """One review cycle as the page lists it."""
    return {"seq": event.seq, "ts": event.ts, "identity": record.identity,
            "outcome": record.outcome, "reason": record.reason, "error": record.error,
            "route": record.route, "model": record.model, "model_calls": record.model_calls,
            "inference_ms": record.inference_ms, "quiet_skips": record.quiet_skips,
            "narration": record.narration, "narration_only": record.narration_only,
            "meaningful_change": record.meaningful_change, "accepted": record.accepted,
            "rejected": record.rejected, "proposed": record.proposed,
            "would_reject": record.would_reject, "counts": record.counts,
            "prompt_tokens": record.prompt_tokens, "completion_tokens": record.completion_tokens}


class ReviewerLog(LogFold):
    """The review cycles the page shows (see the module's docstring), kept current by
    `catch_up`."""

    kinds = KINDS

    def __init__(self, events: EventStore) -> None:
        super().__init__(events)
        self.cycles: deque[dict[str, Any]] = deque(maxlen=CYCLES_KEPT)
        self.journal: deque[dict[str, Any]] = deque(maxlen=JOURNAL_KEPT)
        self.days: dict[int, DayTally] = {}
        self.unreadable = 0

    def fold(self, event: Event) -> None:
        if event.kind == JOURNAL:
            data = event.data if isinstance(event.data, dict) else {}
            self.journal.append({"seq": event.seq, "ts": event.ts, "key": event.key,
                                 "narration": str(data.get("narration", ""))})
            return
        try:
            record = event.payload(CycleRecord)
        except InvalidEvent:
            self.unreadable += 1  # a record of another version of the reviewer
            return
        self.cycles.append(cycle_json(event, record))
        self._count(event, record)

    def _count(self, event: Event, record: CycleRecord) -> None:
        day = event.ts // DAY_MS
        tally = self.days.get(day)
        if tally is None:
            tally = self.days[day] = DayTally(_day_name(day))
            for old in sorted(self.days)[:-DAYS_KEPT]:
                del self.days[old]
        tally.cycles += 1
        tally.outcomes[record.outcome] = tally.outcomes.get(record.outcome, 0) + 1
        tally.model_calls += record.model_calls
        tally.inference_ms += record.inference_ms
        tally.accepted += len(record.accepted)
        tally.rejected += len(record.rejected)
        data = event.data if isinstance(event.data, dict) else {}
        for field in TOKEN_FIELDS:
            count = data.get(field)
            if isinstance(count, int) and not isinstance(count, bool):
                setattr(tally, field, (getattr(tally, field) or 0) + count)

    def verbs(self, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` verbs the reviewer proposed, accepted or rejected, each with
        its reason, the cycle and identity it came from, newest first."""
        found: list[dict[str, Any]] = []
        for cycle in reversed(self.cycles):
            at = {"seq": cycle["seq"], "ts": cycle["ts"], "identity": cycle["identity"]}
            found += [{**at, "accepted": True, "verb": v.get("verb"), "target": v.get("target"),
                       "change": v.get("value") if v.get("delta") is None else v.get("delta"),
                       "reason": v.get("reason", "")} for v in cycle["accepted"]]
            found += [{**at, "accepted": False, "verb": None, "target": None,
                       "change": r.get("proposal"), "reason": r.get("reason", "")}
                      for r in cycle["rejected"]]
            if len(found) >= limit:
                break
        return found[:limit]
