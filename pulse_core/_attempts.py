"""An attempt at an effect, as the log records it: the claim that opens it (`effect-executing`,
with its owner and lease) and the event that says how it ended (`effect-acked`, or
`effect-failed` for good or with the time of the next attempt), written while the lease
holds."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from pulse_core._backoff import Backoff
from pulse_core._clock import Clock
from pulse_core._effect_index import foreign_head
from pulse_core._effects import EffectEntry, EffectOutcome, Executor
from pulse_core._errors import (
    AppendOutcomeUnknown,
    AppendRejected,
    StoreUnavailable,
    VersionConflict,
)
from pulse_core._events import EventDraft
from pulse_core._lease import Owner
from pulse_core._redact import redact_urls
from pulse_core._retries import stored_next
from pulse_core._supervisor import Reporter, StoreOutage
from pulse_core.store import EventStore

WRITE_BACKOFF = Backoff(initial_ms=50, factor=2.0, max_ms=2_000, jitter=0.1)
"""Spacing of the retries of a claim's outcome that the store could not take."""


class Claim(msgspec.Struct, frozen=True, gc=False):
    """An attempt a loop claimed: its effect, the effect's version the claim wrote, when
    its lease runs out (clock ms), its number, origin and executor (None: none here)."""

    entry: EffectEntry
    version: int
    until: int
    attempt: int
    origin: str
    executor: Executor | None


def claim_draft(entry: EffectEntry, owner: Owner, lease_until: int, origin: str, *,
                lease_ms: int | None = None, attempt: int | None = None) -> EventDraft:
    """The `effect-executing` event by which `owner` claims the next attempt at `entry` (or
    `attempt`: one claimed before that never ran) until `lease_until` (its own clock, ms),
    for `lease_ms`: the length other loops count from when they see the claim (None: left
    out, as before claims said it)."""
    data: dict[str, Any] = {"attempt": entry.attempt + 1 if attempt is None else attempt,
                            "lease_until": lease_until,
                            "owner": owner.id, "pid": owner.pid, "started": owner.started}
    if lease_ms is not None:
        data["lease_ms"] = lease_ms
    return EventDraft("effect-executing", entry.id, data, origin=origin, cause=entry.seq)


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


async def record_outcome(store: EventStore, claim: Claim, draft: EventDraft, *, clock: Clock,
                         outage: StoreOutage, on_error: Reporter) -> bool:
    """Append `claim`'s outcome `draft`, expecting the claim's version (or the key's, if only
    events foreign to the effect came since); True once written.

    StoreUnavailable is retried with WRITE_BACKOFF while the lease holds (on `clock`); after
    an AppendOutcomeUnknown, `draft` found stored is written. False (after telling `outage`
    or `on_error`, unless another loop simply took over) leaves the effect to be claimed
    again when the lease expires.
    """
    key = claim.entry.id
    where = f"executor-loop: recording {draft.kind} of effect {key}"
    failures = 0
    maybe_stored = False  # an append of `draft` lost its reply
    expected: int | None = claim.version
    while expected is not None:
        try:
            await store.append([draft], expect={key: expected})
            outage.answered()
            return True
        except VersionConflict:  # a note filed under the key, or another loop took over
            if maybe_stored and await stored_next(store, key, expected, draft):
                outage.answered()
                return True
            expected = await foreign_head(store, key, expected)
        except AppendRejected:
            return False
        except StoreUnavailable as exc:
            maybe_stored = maybe_stored or isinstance(exc, AppendOutcomeUnknown)
            failures += 1
            delay = WRITE_BACKOFF.delay_ms(failures)
            if clock.now_ms() + delay >= claim.until:
                outage.failed(f"{where}: gave up as its lease ends; it will be claimed again",
                              exc)
                return False
            if failures == 1:
                outage.failed(f"{where}: retrying while its lease holds", exc)
            await asyncio.sleep(delay / 1000)
        except Exception as exc:
            on_error(f"{where}: not written; it will be claimed again when its lease ends", exc)
            return False
    return False  # our lease ended and another loop took the effect over

