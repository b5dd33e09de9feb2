"""The cycle ledger: one `awareness-cycle` event per review, folded into cadence state."""

from __future__ import annotations

from typing import Any

import msgspec

from pulse_adapters.awareness.config import AwarenessConfig
from pulse_core import Event, PersistentMap, Projection, register_kind

DAY_MS = 86_400_000
REVIEWED = "reviewed"


class CycleRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What one review cycle saw, asked, got and changed, or how it failed."""

    identity: str
    outcome: str
    reason: str = ""
    error: str | None = None
    route: str = ""
    model: str = ""
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    inference_ms: int = 0
    quiet_skips: int = 0
    fingerprint: str = ""
    source: str | None = None
    counts: dict[str, int] = {}
    available: dict[str, int] = {}
    observation_ids: tuple[str, ...] = ()
    meaningful_change: bool = False
    narration: str = ""
    narration_only: bool = False
    accepted: list[dict[str, Any]] = []
    rejected: list[dict[str, str]] = []
    proposed: int = 0
    would_reject: int = 0


register_kind("awareness-cycle", "one awareness review cycle and its outcome; key: identity",
              CycleRecord)
register_kind("awareness-journal", "the reviewer's narration of a meaningful change")


class ReviewState(msgspec.Struct, frozen=True):
    """One identity's cadence state, from its cycle records."""

    last_cycle_at: int = 0
    last_outcome: str = ""
    failures: int = 0
    last_success_at: int = 0
    reviewed_source: str | None = None
    fingerprint: str | None = None
    day: int = 0
    calls: int = 0


class LedgerData(msgspec.Struct, frozen=True):
    """Cadence state per identity, today's model calls, and the degradation window."""

    identities: PersistentMap[str, ReviewState] = msgspec.field(default_factory=PersistentMap)
    day: int = 0
    calls: int = 0
    window: tuple[tuple[int, int], ...] = ()
    degraded: bool = False

    def calls_today(self, now_ms: int) -> int:
        """Model calls made today, over all identities."""
        return self.calls if self.day == now_ms // DAY_MS else 0


class AwarenessLedger(Projection[LedgerData]):
    """Folds `awareness-cycle` records; enters narration-only degradation when the recent
    rejection rate passes `degrade_above`, and leaves it below `recover_below`."""

    name = "awareness"
    kinds = frozenset({"awareness-cycle"})

    def __init__(self, config: AwarenessConfig | None = None) -> None:
        self.config = config or AwarenessConfig()

    def initial(self) -> LedgerData:
        return LedgerData()

    def apply(self, state: LedgerData, event: Event) -> LedgerData:
        try:
            record = event.payload(CycleRecord)
        except Exception:
            return state
        day = event.ts // DAY_MS
        old = state.identities.get(record.identity) or ReviewState()
        success = record.outcome == REVIEWED
        calls = (old.calls if old.day == day else 0) + record.model_calls
        new = ReviewState(
            last_cycle_at=event.ts, last_outcome=record.outcome,
            failures=0 if success else old.failures + 1,
            last_success_at=event.ts if success else old.last_success_at,
            reviewed_source=record.source if success else old.reviewed_source,
            fingerprint=record.fingerprint if success else old.fingerprint,
            day=day, calls=calls)
        window = state.window
        degraded = state.degraded
        if success and record.proposed:
            window = (*window[-(self.config.degrade_window - 1):],
                      (record.proposed, record.would_reject))
            proposed = sum(p for p, _ in window)
            rate = sum(r for _, r in window) / proposed if proposed else 0.0
            full = len(window) >= self.config.degrade_window
            if not degraded and full and rate > self.config.degrade_above:
                degraded = True
            elif degraded and rate < self.config.recover_below:
                degraded = False
        return LedgerData(
            identities=state.identities.set(record.identity, new), day=day,
            calls=(state.calls if state.day == day else 0) + record.model_calls,
            window=window, degraded=degraded)
