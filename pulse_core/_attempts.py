"""An attempt at an effect, as the log records it: the claim that opens it (`effect-executing`,
with its owner and lease) and the event that says how it ended (`effect-acked`, or
`effect-failed` for good or with the time of the next attempt)."""

from __future__ import annotations

from typing import Any

import msgspec

from pulse_core._effects import EffectEntry, EffectOutcome, Executor
from pulse_core._events import EventDraft
from pulse_core._lease import Owner
from pulse_core._redact import redact_urls


class Claim(msgspec.Struct, frozen=True, gc=False):
    """An attempt a loop claimed: its effect, the effect's version the claim wrote, when
    its lease runs out (clock ms), its number, origin and executor (None: none here)."""

    entry: EffectEntry
    version: int
    until: int
    attempt: int
    origin: str
    executor: Executor | None


def claim_draft(entry: EffectEntry, owner: Owner, lease_until: int, origin: str) -> EventDraft:
    """The `effect-executing` event by which `owner` claims the next attempt at `entry`."""
    return EventDraft(
        "effect-executing", entry.id,
        {"attempt": entry.attempt + 1, "lease_until": lease_until,
         "owner": owner.id, "pid": owner.pid, "started": owner.started},
        origin=origin, cause=entry.seq,
    )


def ending(claim: Claim, now: int, *, acked: dict[str, Any] | None = None, error: str = "",
           final: bool = True, interrupted: bool = False) -> tuple[EventDraft, EffectOutcome]:
    """The event that records how `claim`'s attempt ended at `now` (clock ms), and the outcome
    it stands for: `acked` with its result, else failed with `error` (URLs cut to scheme and
    host), for good when `final`, else to be tried again after the executor's backoff (at
    once when `interrupted`)."""
    entry, attempt, executor = claim.entry, claim.attempt, claim.executor
    if acked is not None:
        return (EventDraft("effect-acked", entry.id, {"attempt": attempt, **acked},
                           origin=claim.origin, cause=entry.seq), EffectOutcome.ACKED)
    data: dict[str, Any] = {"attempt": attempt, "error": redact_urls(error), "final": final}
    if not final:
        # after an operator's retry the backoff starts over, as max_attempts does
        delay = 0 if interrupted or executor is None else executor.backoff.delay_ms(
            attempt - entry.attempts_before_retry)
        data["retry_at"] = now + delay
    if interrupted:
        data["interrupted"] = True
    outcome = (EffectOutcome.INTERRUPTED if interrupted
               else EffectOutcome.FAILED if final else EffectOutcome.RETRY)
    return EventDraft("effect-failed", entry.id, data, origin=claim.origin,
                      cause=entry.seq), outcome
