"""The reviewer in the web UI: its page, what each review cycle did and what the reviewer
is, and its metrics (ReviewerTally: cycles by outcome, model calls, verbs).

Its view gives each review cycle's outcome (newest first), the verbs the model proposed with
the gate's verdict and reason, its narration and journal, the reviews that ran no cycle and
why, each identity's cadence state and the degradation state (the AwarenessLedger), and per
UTC day the cycles, model calls, inference time and tokens (ReviewerRecords). Everything
comes from the log, folded in the UI's process. Quiet skips are not events (the reviewer keeps
them in the side store): a cycle says how many unchanged checks it followed (`quiet_skips`).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from pulse_adapters.awareness.effects import AwarenessReview
from pulse_adapters.awareness.executor import ALREADY_REVIEWED
from pulse_adapters.awareness.ledger import DAY_MS, AwarenessLedger, CycleRecord, LedgerData
from pulse_core import (
    EffectEntry,
    EffectStatus,
    Event,
    InvalidEvent,
    LayerMetric,
    PageRequest,
    Projection,
    UiPage,
)

CYCLE, JOURNAL = "awareness-cycle", "awareness-journal"
CYCLES_KEPT = 200
"""The newest cycles the page can list."""
JOURNAL_KEPT = 50
DAYS_KEPT = 30
CYCLES_SHOWN = 100
VERBS_SHOWN = 100
SKIPPED_SHOWN = 50
TOKEN_FIELDS = ("prompt_tokens", "completion_tokens")
"""Token counts a cycle record may carry (those the model server reported for its calls)."""


class DayTally(msgspec.Struct, frozen=True):
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


class RecordsData(msgspec.Struct, frozen=True):
    """The newest cycles (as the page lists them) and journal entries, oldest first, the
    tally of each of the last DAYS_KEPT days (by UTC day number), and how many cycle
    records could not be read (written by another version of the reviewer)."""

    cycles: tuple[dict[str, Any], ...] = ()
    journal: tuple[dict[str, Any], ...] = ()
    days: dict[int, DayTally] = msgspec.field(default_factory=dict)
    unreadable: int = 0


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


def _tally(old: DayTally, event: Event, record: CycleRecord) -> DayTally:
    tokens: dict[str, int | None] = {}
    data = event.data if isinstance(event.data, dict) else {}
    for field in TOKEN_FIELDS:
        count = data.get(field)
        if isinstance(count, int) and not isinstance(count, bool):
            tokens[field] = (getattr(old, field) or 0) + count
    return msgspec.structs.replace(
        old, cycles=old.cycles + 1,
        outcomes={**old.outcomes, record.outcome: old.outcomes.get(record.outcome, 0) + 1},
        model_calls=old.model_calls + record.model_calls,
        inference_ms=old.inference_ms + record.inference_ms,
        accepted=old.accepted + len(record.accepted),
        rejected=old.rejected + len(record.rejected), **tokens)


class ReviewerRecords(Projection[RecordsData]):
    """The review cycles and journal the page shows, and the tally of each day."""

    name = "awareness-page"
    kinds = frozenset({CYCLE, JOURNAL})

    def initial(self) -> RecordsData:
        return RecordsData()

    def apply(self, state: RecordsData, event: Event) -> RecordsData:
        if event.kind == JOURNAL:
            data = event.data if isinstance(event.data, dict) else {}
            entry = {"seq": event.seq, "ts": event.ts, "key": event.key,
                     "narration": str(data.get("narration", ""))}
            return msgspec.structs.replace(
                state, journal=(*state.journal, entry)[-JOURNAL_KEPT:])
        try:
            record = event.payload(CycleRecord)
        except InvalidEvent:
            return msgspec.structs.replace(state, unreadable=state.unreadable + 1)
        day = event.ts // DAY_MS
        days = {**state.days, day: _tally(state.days.get(day) or DayTally(_day_name(day)),
                                          event, record)}
        for old in sorted(days)[:-DAYS_KEPT]:
            del days[old]
        return msgspec.structs.replace(
            state, cycles=(*state.cycles, cycle_json(event, record))[-CYCLES_KEPT:], days=days)


def verbs(records: RecordsData, limit: int) -> list[dict[str, Any]]:
    """The newest `limit` verbs the reviewer proposed, accepted or rejected, each with its
    reason, the cycle and identity it came from, newest first."""
    found: list[dict[str, Any]] = []
    for cycle in reversed(records.cycles):
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


def skipped_json(entry: EffectEntry) -> dict[str, Any] | None:
    """An `awareness-review` effect that ran no review cycle, with why; None when it did
    (or has not finished)."""
    body = entry.data.get("effect") if isinstance(entry.data, dict) else None
    body = body if isinstance(body, dict) else {}
    result = entry.result if isinstance(entry.result, dict) else {}
    if entry.status is EffectStatus.ACKED and result.get("outcome") == ALREADY_REVIEWED:
        why = f"another review settled this world first (cycle #{result.get('cycle')})"
    elif entry.status is EffectStatus.FAILED:
        why = f"the review could not run: {entry.error}"
    elif entry.status is EffectStatus.CANCELLED:
        why = "cancelled"
    else:
        return None
    return {"effect": entry.id, "ts": entry.updated_at, "identity": body.get("identity"),
            "asked_because": body.get("reason"), "status": str(entry.status), "why": why}


def identities(ledger: LedgerData, now: int) -> list[dict[str, Any]]:
    """Each reviewed identity's cadence state, most recently reviewed first."""
    found = [{"identity": name, "last_cycle_at": s.last_cycle_at or None,
              "last_outcome": s.last_outcome, "failures_in_a_row": s.failures,
              "last_success_at": s.last_success_at or None,
              "calls_today": s.calls if s.day == now // DAY_MS else 0}
             for name, s in ledger.identities.items()]
    return sorted(found, key=lambda i: i["last_cycle_at"] or 0, reverse=True)


def degradation(ledger: LedgerData) -> dict[str, Any]:
    """Whether the reviewer is degraded to narration only (too many of its proposals were
    rejected lately), and the window of recent reviews that decides it."""
    proposed = sum(p for p, _ in ledger.window)
    rejected = sum(r for _, r in ledger.window)
    return {"degraded": ledger.degraded, "window_reviews": len(ledger.window),
            "proposed": proposed, "would_reject": rejected,
            "rejection_rate": round(rejected / proposed, 3) if proposed else None}


async def reviewer(request: PageRequest) -> dict[str, Any]:
    """What the Reviewer page shows."""
    ledger = request.snapshot.state(AwarenessLedger)
    records = request.snapshot.state(ReviewerRecords)
    now = request.now
    skipped = [s for e in request.effects(AwarenessReview.tag())
               if (s := skipped_json(e)) is not None]
    return {
        "now": now, "degradation": degradation(ledger), "calls_today": ledger.calls_today(now),
        "identities": identities(ledger, now),
        "cycles": list(reversed(records.cycles))[:CYCLES_SHOWN],
        "verbs": verbs(records, VERBS_SHOWN), "skipped": skipped[:SKIPPED_SHOWN],
        "journal": list(reversed(records.journal)),
        "days": [records.days[day] for day in sorted(records.days, reverse=True)],
        "unreadable_cycles": records.unreadable,
        "kinds": [CYCLE, JOURNAL],
    }


def reviewer_page(ledger: AwarenessLedger) -> UiPage:
    """The Reviewer page, reading `ledger` (the layer's own, with its settings) and the
    ReviewerRecords."""
    return UiPage("reviewer", "Reviewer", reviewer, projections=(ledger, ReviewerRecords()),
                  assets="pulse_adapters.awareness:ui")


class ReviewerCounts(msgspec.Struct, frozen=True):
    """Every review cycle's outcome, the model calls the cycles made, the verbs the gate
    accepted (by verb) and the proposals it rejected, since the log began."""

    cycles: dict[str, int] = msgspec.field(default_factory=dict)
    model_calls: int = 0
    accepted: dict[str, int] = msgspec.field(default_factory=dict)
    rejected: int = 0


class ReviewerTally(Projection[ReviewerCounts]):
    """The reviewer's counts for /metrics (see ReviewerCounts)."""

    name = "awareness-tally"
    kinds = frozenset({CYCLE})

    def initial(self) -> ReviewerCounts:
        return ReviewerCounts()

    def apply(self, state: ReviewerCounts, event: Event) -> ReviewerCounts:
        try:
            record = event.payload(CycleRecord)
        except InvalidEvent:
            return state
        accepted = dict(state.accepted)
        for verb in record.accepted:
            name = str(verb.get("verb", "unknown"))
            accepted[name] = accepted.get(name, 0) + 1
        return ReviewerCounts(
            cycles={**state.cycles, record.outcome: state.cycles.get(record.outcome, 0) + 1},
            model_calls=state.model_calls + record.model_calls, accepted=accepted,
            rejected=state.rejected + len(record.rejected))


def reviewer_metrics() -> tuple[LayerMetric, ...]:
    """The reviewer's families in /metrics."""
    tally = ReviewerTally()
    return (
        LayerMetric("pulse_reviewer_cycles", "Awareness review cycles by outcome", tally,
                    lambda s: s.cycles, label="outcome"),
        LayerMetric("pulse_reviewer_model_calls", "Model calls the awareness reviewer made",
                    tally, lambda s: s.model_calls),
        LayerMetric("pulse_reviewer_verbs_accepted", "Verbs the awareness reviewer's gate "
                    "accepted, by verb", tally, lambda s: s.accepted, label="verb"),
        LayerMetric("pulse_reviewer_verbs_rejected", "Proposals the awareness reviewer's gate "
                    "rejected", tally, lambda s: s.rejected),
    )
