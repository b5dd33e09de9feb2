"""The Reviewer page's API: what the awareness reviewer (pulse_adapters.awareness) did and is.

GET /api/reviewer gives each review cycle's outcome (newest first), the verbs the model
proposed with the gate's verdict and reason, its narration and journal, the reviews that
ran no cycle and why, each identity's cadence state and the degradation state (from the
AwarenessLedger projection the UI folds), and per UTC day the cycles, model calls, inference
time and tokens. Everything comes from the log: cycles from `awareness-cycle` records
(pulse_adapters.web._reviewer_log), reviews without a cycle from the `awareness-review`
effects (the UI's LogBook). Quiet skips are not events (the reviewer keeps them in the side
store): a cycle says how many unchanged checks it followed (`quiet_skips`). When the engine
runs without the awareness layer the answer says so (`enabled` false) and still shows what
the log holds.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from pulse_adapters.awareness.effects import AwarenessReview
from pulse_adapters.awareness.executor import ALREADY_REVIEWED
from pulse_adapters.awareness.ledger import DAY_MS, AwarenessLedger, LedgerData
from pulse_adapters.awareness.settings import LAYER
from pulse_adapters.web._reviewer_log import KINDS, ReviewerLog
from pulse_adapters.web._state import WebState
from pulse_core import EffectEntry, EffectStatus

CYCLES_SHOWN = 100
VERBS_SHOWN = 100
SKIPPED_SHOWN = 50
NOT_CONFIGURED = ("the awareness layer is not configured: add it under `layers` in "
                  "config.json (`\"awareness\": {\"base_url\": ..., \"model\": ...}`, see "
                  "docs/awareness.md) and the daemon reviews memory; what the log holds from "
                  "earlier reviews is shown")


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


async def reviewer(state: WebState, log: ReviewerLog) -> dict[str, Any]:
    """What the Reviewer page shows."""
    engine = state.engine
    await log.catch_up()
    await state.book.catch_up(frozenset(engine.report.survival_tags))
    ledger = (await engine.snapshot()).state(AwarenessLedger)
    now = engine.clock.now_ms()
    enabled = LAYER in engine.report.layers
    reviews = sorted((e for e in state.book.effects.values()
                      if e.tag == AwarenessReview.tag()), key=lambda e: e.seq, reverse=True)
    skipped = [s for e in reviews if (s := skipped_json(e)) is not None]
    return {
        "enabled": enabled, "note": None if enabled else NOT_CONFIGURED, "now": now,
        "degradation": degradation(ledger), "calls_today": ledger.calls_today(now),
        "identities": identities(ledger, now),
        "cycles": list(reversed(log.cycles))[:CYCLES_SHOWN],
        "verbs": log.verbs(VERBS_SHOWN), "skipped": skipped[:SKIPPED_SHOWN],
        "journal": list(reversed(log.journal)),
        "days": [log.days[day] for day in sorted(log.days, reverse=True)],
        "unreadable_cycles": log.unreadable,
        "kinds": list(KINDS),
    }


def routes(state: WebState) -> list[BaseRoute]:
    """GET /api/reviewer."""
    log = ReviewerLog(state.engine.events)

    async def api_reviewer(request: Request) -> Response:
        return JSONResponse(msgspec.to_builtins(await reviewer(state, log)))

    return [Route("/api/reviewer", api_reviewer)]
