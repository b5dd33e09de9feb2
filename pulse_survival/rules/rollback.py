"""panic_rollback and auto_rollback: the engine directory goes back when things break."""

from __future__ import annotations

from pulse_core import Decision, Inner, Snapshot
from pulse_survival.config import RollbackPolicy
from pulse_survival.effects import Notify, Rollback
from pulse_survival.rules.base import SurvivalRule, ledger


class PanicRollback(SurvivalRule):
    """Survival effects failing `panic_failures` times in a row: emergency rollback + notify.

    Bypasses every rule inside it for that tick: when the reflexes themselves fail, nothing
    else should act until the engine directory is back on its last known good revision.
    """

    name = "panic_rollback"
    emits = (Rollback, Notify)

    def __init__(self, policy: RollbackPolicy) -> None:
        self.policy = policy

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        streak = ledger(curr).failure_streak
        if streak < self.policy.panic_failures:
            return await inner(prev, curr)
        reason = f"{streak} survival effects failed in a row"
        return Decision([
            Rollback(reason=reason, emergency=True),
            Notify(topic="panic", level="critical", text=f"emergency rollback: {reason}"),
        ], 1_000)


class AutoRollback(SurvivalRule):
    """After a promote, `auto_errors` errors within `auto_window_s`: roll that promotion back."""

    name = "auto_rollback"
    emits = (Rollback, Notify)

    def __init__(self, policy: RollbackPolicy) -> None:
        self.policy = policy

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        state = ledger(curr)
        if state.promote_ts is None:
            return Decision(effects, tick_ms)
        since = max(state.promote_ts, curr.at - self.policy.auto_window_s * 1000)
        errors = sum(1 for ts in state.errors_since_promote if ts >= since)
        if errors < self.policy.auto_errors:
            return Decision(effects, tick_ms)
        revision = state.promote_revision or "the last promotion"
        reason = (f"{errors} errors within {self.policy.auto_window_s} s of promoting "
                  f"{revision}")
        return Decision([*effects, Rollback(reason=reason),
                         Notify(topic="rollback", level="warning", text=reason)], tick_ms)
