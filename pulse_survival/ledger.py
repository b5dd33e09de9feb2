"""The survival ledger: what the survival layer has done, folded from the log.

Budgets and once-only notices live here, not in rule memory, so a restarted engine neither
forgets its restart budget nor announces the same outage twice.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pulse_core import Event, Projection
from pulse_survival.effects import SURVIVAL_TAGS

_RECENT = 200


class SurvivalLedgerData(msgspec.Struct, frozen=True):
    """Survival bookkeeping; see SurvivalLedger."""

    open: dict[str, str] = {}
    failure_streak: int = 0
    restarts: dict[str, tuple[int, ...]] = {}
    given_up: frozenset[str] = frozenset()
    promote_ts: int | None = None
    promote_revision: str | None = None
    errors_since_promote: tuple[int, ...] = ()
    network_down: bool = False
    last_escalation: int | None = None


def _effect_body(event: Event) -> dict[str, Any]:
    data = event.data if isinstance(event.data, dict) else {}
    body = data.get("effect")
    return body if isinstance(body, dict) else {}


class SurvivalLedger(Projection[SurvivalLedgerData]):
    """Restarts per process, given-up processes, the survival failure streak, the last
    promotion and the errors since, whether a network outage was announced."""

    name = "survival"
    kinds = frozenset({"effect", "effect-acked", "effect-failed", "promote", "rollback",
                       "error"})

    def initial(self) -> SurvivalLedgerData:
        return SurvivalLedgerData()

    def apply(self, state: SurvivalLedgerData, event: Event) -> SurvivalLedgerData:
        if event.kind == "effect":
            return self._effect(state, event)
        if event.kind in ("effect-acked", "effect-failed"):
            tag = state.open.get(event.key)
            if tag is None:
                return state
            data = event.data if isinstance(event.data, dict) else {}
            done = event.kind == "effect-acked" or bool(data.get("final"))
            open_ = {k: v for k, v in state.open.items() if k != event.key} if done else state.open
            streak = state.failure_streak
            if tag not in ("rollback", "notify"):
                streak = 0 if event.kind == "effect-acked" else streak + 1
            return msgspec.structs.replace(state, open=open_, failure_streak=streak)
        if event.kind == "promote":
            revision = event.data.get("revision") if isinstance(event.data, dict) else None
            return msgspec.structs.replace(state, promote_ts=event.ts,
                                           promote_revision=revision, errors_since_promote=())
        if event.kind == "rollback":
            return msgspec.structs.replace(state, promote_ts=None, promote_revision=None,
                                           errors_since_promote=())
        if event.kind == "error" and state.promote_ts is not None:
            errors = (*state.errors_since_promote[-(_RECENT - 1):], event.ts)
            return msgspec.structs.replace(state, errors_since_promote=errors)
        return state

    def _effect(self, state: SurvivalLedgerData, event: Event) -> SurvivalLedgerData:
        body = _effect_body(event)
        tag = body.get("type")
        if tag not in SURVIVAL_TAGS:
            return state
        changes: dict[str, Any] = {"open": {**state.open, event.key: tag}}
        if tag == "restart-process":
            name = str(body.get("name"))
            changes["restarts"] = {
                **state.restarts, name: (*state.restarts.get(name, ())[-(_RECENT - 1):],
                                         event.ts)}
        elif tag == "rollback":
            changes.update(failure_streak=0, promote_ts=None, promote_revision=None,
                           errors_since_promote=())
        elif tag == "notify":
            topic, level = str(body.get("topic")), str(body.get("level"))
            if topic.startswith("process:"):
                name = topic.removeprefix("process:")
                if level == "given-up":
                    changes["given_up"] = state.given_up | {name}
                elif level == "recovered":
                    changes["given_up"] = state.given_up - {name}
            elif topic == "network":
                changes["network_down"] = level == "outage"
            elif topic == "error-log":
                changes["last_escalation"] = event.ts
        return msgspec.structs.replace(state, **changes)
