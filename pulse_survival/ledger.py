"""The survival ledger: what the survival layer has done and decided, folded from the log.

Restart budgets, failed starts, streaks, backoffs and once-only notices live here, folded from
the survival effects and the rules' marks (pulse_survival.marks), never from rule memory and
never parsed out of a notice's text: a restarted engine neither forgets its restart budget nor
announces the same outage twice, and every reader of the log sees the same state.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pulse_core import (
    Effect,
    EffectEntry,
    EffectStatus,
    Event,
    Projection,
    UnknownEffect,
    decode_effect,
    decode_mark,
    fold_effect,
    host_of,
    human_origin,
)
from pulse_survival.effects import SURVIVAL_TAGS, Notify, RestartProcess, Rollback
from pulse_survival.marks import (
    ErrorsEscalated,
    GaveUp,
    LlmRestartScheduled,
    LlmRouteHealthy,
    NetworkOutageAnnounced,
    NetworkRecoveryAnnounced,
    Recovered,
    RequestHandled,
    StartFailed,
    StartHeld,
    StreakCounted,
)
from pulse_survival.requests import PROCESS_REQUESTED, ProcessRequest

_RECENT = 200


class PendingRequest(msgspec.Struct, frozen=True):
    """An operator's request not yet acted on: `action`, the seq of its event, who asked."""

    action: str
    seq: int
    origin: str = ""


class ProcessRecord(msgspec.Struct, frozen=True):
    """process_watchdog's state of one essential process.

    `restarts`: when restarts were made (ms, newest last); `failed_starts`: restarts in a row
    that did not stay up; `judged`: the restart last judged held or failed; `given_up`: why
    the watchdog stopped restarting it (None while it still restarts it); `stopped`: an
    operator stopped it, and it is not restarted until started again; `pending`: an
    operator's request not yet acted on; `counted_from`: the hourly restart budget counts
    restarts from then on (the last operator's start or reset).
    """

    restarts: tuple[int, ...] = ()
    failed_starts: int = 0
    judged: int | None = None
    given_up: str | None = None
    stopped: bool = False
    pending: PendingRequest | None = None
    counted_from: int = 0


class LlmRecord(msgspec.Struct, frozen=True):
    """llm_watchdog's state: restarts since the route was last healthy, and when the next one
    may be made (ms)."""

    restarts: int = 0
    next_allowed_at: int = 0


class ErrorNotice(msgspec.Struct, frozen=True):
    """error_escalate's last digest: when (ms), and the error-log totals it counted up to
    (`run` names the watcher that counted them)."""

    at: int
    run: str = ""
    total: int = 0
    by_pattern: dict[str, int] = {}


class SurvivalLedgerData(msgspec.Struct, frozen=True):
    """Survival bookkeeping; see SurvivalLedger. `open` holds the survival effects not yet
    finished, as the one effect-lifecycle fold (`pulse_core.fold_effect`) leaves them."""

    open: dict[str, EffectEntry] = {}
    failure_streak: int = 0
    processes: dict[str, ProcessRecord] = {}
    streaks: dict[str, int] = {}
    llm: LlmRecord = LlmRecord()
    promote_ts: int | None = None
    promote_revision: str | None = None
    errors_since_promote: tuple[int, ...] = ()
    network_down: bool = False
    error_notice: ErrorNotice | None = None

    def process(self, name: str) -> ProcessRecord:
        """The record of essential process `name` (empty if nothing happened to it yet)."""
        return self.processes.get(name) or ProcessRecord()

    def streak(self, rule: str) -> int:
        """How many samples in a row met `rule`'s condition."""
        return self.streaks.get(rule, 0)


def _decoded(event: Event) -> Effect | None:
    """The effect an `effect` event holds; None when it does not decode."""
    try:
        return decode_effect(event.data)
    except (UnknownEffect, msgspec.ValidationError):
        return None


def _with_process(state: SurvivalLedgerData, name: str, **changes: Any) -> SurvivalLedgerData:
    record = msgspec.structs.replace(state.process(name), **changes)
    return msgspec.structs.replace(state, processes={**state.processes, name: record})


def _handled(state: SurvivalLedgerData, mark: RequestHandled) -> SurvivalLedgerData:
    """The record of `mark.name` once the watchdog acted on an operator's request."""
    record = state.process(mark.name)
    pending = None if record.pending is None or record.pending.seq == mark.request \
        else record.pending
    if mark.action == "stop":
        return _with_process(state, mark.name, pending=pending, stopped=True)
    return _with_process(state, mark.name, pending=pending, stopped=False, given_up=None,
                         failed_starts=0, counted_from=mark.at)


class SurvivalLedger(Projection[SurvivalLedgerData]):
    """Per essential process: restarts, failed starts, given up; streaks of the sample-counting
    rules; the LLM restart backoff; the survival effects' failure streak; the last promotion
    and the errors since; whether a network outage is announced; the last error digest.

    An effect an operator cancels leaves the failure streak as it was (it neither failed nor
    ran); one an operator retries after it finished is outside the streak: the streak counts
    the reflexes' own attempts.
    """

    name = "survival"
    version = 4
    kinds = frozenset({"effect", "effect-acked", "effect-failed", "effect-cancelled",
                       "promote", "rollback", "error", "mark", PROCESS_REQUESTED})

    def __init__(self, host: str = "") -> None:
        #: where engines of several hosts share the log, the host whose survival this folds:
        #: effects, marks, promotions and rollbacks another host recorded are not its own
        self.host = host

    def initial(self) -> SurvivalLedgerData:
        return SurvivalLedgerData()

    def _own(self, event: Event) -> bool:
        """Whether `event` belongs to this host's survival: it names this host, or it names
        none and is no error (errors count against a promotion only on the host they name)."""
        host = host_of(event)
        return host == self.host or (host == "" and event.kind != "error")

    def apply(self, state: SurvivalLedgerData, event: Event) -> SurvivalLedgerData:
        if self.host and not self._own(event):
            return state
        if event.kind == "mark":
            return self._mark(state, event)
        if event.kind == PROCESS_REQUESTED:
            return self._request(state, event)
        if event.kind == "effect":
            return self._effect(state, event)
        if event.kind in ("effect-acked", "effect-failed", "effect-cancelled"):
            return self._outcome(state, event)
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

    def _outcome(self, state: SurvivalLedgerData, event: Event) -> SurvivalLedgerData:
        entry = state.open.get(event.key)
        if entry is None:
            return state
        # fold_effect changes the entry it is given; the previous state still holds this one
        after = fold_effect(msgspec.structs.replace(entry), event)
        if after is None:
            return state
        open_ = {k: v for k, v in state.open.items() if k != event.key}
        if not after.finished:
            open_[event.key] = after
        streak = state.failure_streak
        if (after.tag not in (Rollback.tag(), Notify.tag())
                and after.status is not EffectStatus.CANCELLED):
            streak = 0 if after.status is EffectStatus.ACKED else streak + 1
        return msgspec.structs.replace(state, open=open_, failure_streak=streak)

    def _effect(self, state: SurvivalLedgerData, event: Event) -> SurvivalLedgerData:
        entry = fold_effect(None, event)
        if entry is None or entry.tag not in SURVIVAL_TAGS:
            return state
        state = msgspec.structs.replace(state, open={**state.open, event.key: entry})
        effect = _decoded(event)
        if isinstance(effect, RestartProcess):
            restarts = (*state.process(effect.name).restarts[-(_RECENT - 1):], event.ts)
            return _with_process(state, effect.name, restarts=restarts)
        if isinstance(effect, Rollback):
            return msgspec.structs.replace(state, failure_streak=0, promote_ts=None,
                                           promote_revision=None, errors_since_promote=())
        return state

    def _request(self, state: SurvivalLedgerData, event: Event) -> SurvivalLedgerData:
        """An operator's request is pending until the watchdog handles it; a newer one of the
        same process takes its place. Only a person's is one: its origin says a person wrote
        it, which only a person's store handle may (an agent's or the engine's is ignored)."""
        if not human_origin(event.origin):
            return state
        try:
            request = msgspec.convert(event.data, ProcessRequest)
        except msgspec.ValidationError:
            return state
        pending = PendingRequest(request.action, event.seq, event.origin)
        return _with_process(state, request.name, pending=pending)

    def _mark(self, state: SurvivalLedgerData, event: Event) -> SurvivalLedgerData:
        mark = decode_mark(event)
        if isinstance(mark, StreakCounted):
            return msgspec.structs.replace(state, streaks={**state.streaks,
                                                           mark.rule: mark.count})
        if isinstance(mark, StartFailed):
            failed = state.process(mark.name).failed_starts + 1
            return _with_process(state, mark.name, failed_starts=failed,
                                 judged=mark.restart_at)
        if isinstance(mark, StartHeld):
            judged = state.process(mark.name).judged if mark.restart_at is None \
                else mark.restart_at
            return _with_process(state, mark.name, failed_starts=0, judged=judged)
        if isinstance(mark, GaveUp):
            return _with_process(state, mark.name, given_up=mark.why)
        if isinstance(mark, Recovered):
            return _with_process(state, mark.name, given_up=None, failed_starts=0)
        if isinstance(mark, RequestHandled):
            return _handled(state, mark)
        if isinstance(mark, LlmRestartScheduled):
            return msgspec.structs.replace(state, llm=LlmRecord(mark.count,
                                                                mark.next_allowed_at))
        if isinstance(mark, LlmRouteHealthy):
            return msgspec.structs.replace(state, llm=msgspec.structs.replace(state.llm,
                                                                              restarts=0))
        if isinstance(mark, NetworkOutageAnnounced):
            return msgspec.structs.replace(state, network_down=True)
        if isinstance(mark, NetworkRecoveryAnnounced):
            return msgspec.structs.replace(state, network_down=False)
        if isinstance(mark, ErrorsEscalated):
            notice = ErrorNotice(mark.at, mark.run, mark.total, dict(mark.by_pattern))
            return msgspec.structs.replace(state, error_notice=notice)
        return state
