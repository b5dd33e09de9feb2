"""Cancel and retry: an operator's say over one effect, as events the executor loop honours.

`effect-cancelled` takes a pending or retrying effect out of every executor loop's hands;
`effect-retried` makes an effect that failed for good, or was cancelled, pending again, with
its executor's `max_attempts` counted afresh. Each is an append on the effect's key that
expects the version just read, so a race with a claim is settled by the store: whichever
commits first wins, and a control that loses reads the effect again and judges its new state.
"""

from __future__ import annotations

import time

from pulse_core._effects import EffectEntry, EffectStatus, fold_effect
from pulse_core._errors import (
    EffectNotFound,
    EffectStateConflict,
    InvalidEvent,
    VersionConflict,
)
from pulse_core._events import Event, EventDraft
from pulse_core._lease import owner_host
from pulse_core.store import EventStore

CANCELLABLE = frozenset({EffectStatus.PENDING, EffectStatus.RETRYING})
RETRYABLE = frozenset({EffectStatus.FAILED, EffectStatus.CANCELLED})
_APPLIES = {
    "cancel": "cancel applies to pending or retrying effects",
    "retry": "retry applies to effects that failed for good or were cancelled",
}
ERROR_SHOWN = 200
"""How much of an effect's last error a refusal quotes."""


REASON_MAX = 1_000
"""The longest reason a cancel or retry records (it reaches every live page that shows it)."""


async def cancel_effect(events: EventStore, effect_id: str, *, reason: str,
                        origin: str = "operator") -> Event:
    """Cancel pending or retrying effect `effect_id`: append `effect-cancelled` (data:
    `reason`, and the status it `was` in; origin `human:<origin>`), after which no executor
    loop claims it. Returns the stored event.

    EffectNotFound for an id no effect has; EffectStateConflict naming the effect's state and
    what to do when it is executing or finished (also when a claim commits first).
    """
    return await _control(events, effect_id, "cancel", reason, origin)


async def retry_effect(events: EventStore, effect_id: str, *, reason: str,
                       origin: str = "operator") -> Event:
    """Retry effect `effect_id`, which failed for good or was cancelled: append
    `effect-retried` (data: `reason`, and the status it `was` in; origin `human:<origin>`),
    after which it is pending again and its executor gets `max_attempts` more attempts,
    numbered on from the last. Returns the stored event.

    EffectNotFound for an id no effect has; EffectStateConflict naming the effect's state and
    what to do when it is not failed or cancelled.
    """
    return await _control(events, effect_id, "retry", reason, origin)


async def _control(events: EventStore, effect_id: str, action: str, reason: str,
                   origin: str) -> Event:
    if not isinstance(reason, str) or len(reason) > REASON_MAX:
        raise InvalidEvent(f"reason: give at most {REASON_MAX} characters of text, saying why "
                           f"(got {len(reason) if isinstance(reason, str) else type(reason)})")
    if not isinstance(origin, str) or not origin or any(c.isspace() for c in origin):
        raise InvalidEvent(f"origin {origin!r}: name who asks in one word, like 'operator', "
                           "'web' or 'cli' (the event's origin is human:<origin>)")
    kind, allowed = (("effect-cancelled", CANCELLABLE) if action == "cancel"
                     else ("effect-retried", RETRYABLE))
    while True:
        entry = await read_effect(events, effect_id)
        if entry.status not in allowed:
            raise refusal(entry, action, time.time_ns() // 1_000_000)
        draft = EventDraft(kind, effect_id, {"reason": reason, "was": str(entry.status)},
                           origin=f"human:{origin}", cause=entry.seq)
        try:
            appended = await events.append([draft], expect={effect_id: entry.version})
        except VersionConflict:
            continue  # moved on since the read (a claim, most likely): judge its new state
        return appended.events[0]


async def read_effect(events: EventStore, effect_id: str) -> EffectEntry:
    """Effect `effect_id` folded from its events; EffectNotFound when the log has none. Its
    version is its key's, a note filed under the key counted too (the fold passes over it)."""
    if not isinstance(effect_id, str) or not effect_id:  # None would read every key
        raise EffectNotFound(str(effect_id), f"{effect_id!r} is not an effect id — `upulse "
                                             "effects` lists the effects and their ids")
    entry: EffectEntry | None = None
    for event in await events.read(key=effect_id):
        entry = fold_effect(entry, event)
    if entry is None:
        raise EffectNotFound(effect_id, f"no effect {effect_id!r} in this log — `upulse "
                                        "effects` lists the effects and their ids")
    return entry


def _clock(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000))


def refusal(entry: EffectEntry, action: str, now_ms: int) -> EffectStateConflict:
    """The error for `action` ("cancel" or "retry") on `entry`, whose state does not allow
    it: the state, and what to do instead."""
    retry_hint = f"`upulse effects retry {entry.id}` runs it again"
    status = entry.status
    if status is EffectStatus.EXECUTING:
        holder = f"{owner_host(entry.owner) or entry.owner or 'an unnamed owner'}/{entry.owner_pid}"
        lease = (f"lease held by {holder} until {_clock(entry.lease_until)}"
                 if entry.lease_until > now_ms else
                 f"the lease of {holder} has ended, so it will be claimed again")
        state = f"is executing (attempt {entry.attempt}, {lease})"
        todo = "wait for it to finish"
    elif status is EffectStatus.PENDING:
        state, todo = "is pending", "it runs as soon as an executor loop claims it"
    elif status is EffectStatus.RETRYING:
        state = (f"is retrying (attempt {entry.attempt} failed; the next is due at "
                 f"{_clock(entry.retry_at)})")
        todo = "it runs again by itself (cancel it to stop that)"
    elif status is EffectStatus.ACKED:
        state = f"is acked (attempt {entry.attempt})"
        todo = ("it ran already" if action == "cancel"
                else "it ran; record a new effect to do it again")
    elif status is EffectStatus.FAILED:
        error = " ".join(str(entry.error).split())
        if len(error) > ERROR_SHOWN:
            error = error[:ERROR_SHOWN - 1] + "…"
        state = f"failed for good (attempt {entry.attempt}: {error})"
        todo = f"nothing will run it; {retry_hint}"
    else:
        state, todo = "is cancelled already", f"nothing will run it; {retry_hint}"
    return EffectStateConflict(entry.id, str(status),
                               f"effect {entry.id} {state} — {todo}; {_APPLIES[action]}")
