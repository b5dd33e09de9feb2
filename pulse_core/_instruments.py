"""The engine's instruments: what it measures as it works (each tick, each attempt at an
effect), for a listener such as a metrics exporter.

A listener subclasses `Instruments` and overrides the methods it needs (each does nothing by
default); `engine.instrument(listener)` attaches it and returns the function that detaches it.
The engine calls the methods on its event loop, at the moment it measured, so a listener must
be quick and must not block (count, observe; no I/O). A listener that raises is detached at
once and its error reported once (an `error` event keyed
`engine:instruments:<its class>.<method>`, and a warning on the `pulse` logger):
a broken exporter never breaks a tick or an attempt, and never floods the log. Attach it
again to resume. With nothing attached, a call is a loop over an empty tuple.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from pulse_core._effects import EffectEntry, EffectOutcome, EffectStatus
from pulse_core._errors import PulseError
from pulse_core._supervisor import Reporter

log = logging.getLogger("pulse")


class Instruments:
    """Listens to an engine's measurements; every method does nothing until overridden.

    Durations are wall-clock seconds; the dispatch latency is measured on the engine's clock.
    """

    def tick(self, number: int, duration_s: float) -> None:
        """Tick `number` ran (snapshot, rule chain and its append) in `duration_s`."""

    def dispatched(self, tag: str, latency_s: float) -> None:
        """An attempt at an effect of type `tag` was claimed `latency_s` after it became due:
        after its commit (a first attempt, or one an operator asked again), its `retry_at`
        (a retry) or its lease's end (an attempt taken over); see `waited_s`."""

    def executed(self, tag: str, outcome: EffectOutcome, duration_s: float) -> None:
        """An attempt at an effect of type `tag` ended with `outcome` (its result recorded),
        `duration_s` after its claim; INTERRUPTED when the engine's shutdown cancelled it."""


class InstrumentFanOut(Instruments):
    """The engine's instruments: every attached listener, in the order attached. A listener
    that raises is detached and reported to `on_error` (once, as it is no longer called)."""

    def __init__(self, on_error: Reporter) -> None:
        self.on_error = on_error
        self._listeners: tuple[Instruments, ...] = ()

    def attach(self, listener: Instruments) -> Callable[[], None]:
        """Call `listener` from now on; returns the function that detaches it (calling that
        again, or after the listener was detached for raising, does nothing)."""
        if not isinstance(listener, Instruments):
            raise PulseError(f"{type(listener).__name__} is not an Instruments: subclass "
                             "pulse_core.Instruments and override the methods it needs")
        if any(found is listener for found in self._listeners):
            raise PulseError(f"this {type(listener).__name__} is attached already: attach "
                             "each listener once (its detach function ends it)")
        self._listeners = (*self._listeners, listener)
        return lambda: self._detach(listener)

    @property
    def listeners(self) -> tuple[Instruments, ...]:
        """The listeners attached now."""
        return self._listeners

    def _detach(self, listener: Instruments) -> None:
        self._listeners = tuple(found for found in self._listeners if found is not listener)

    def _failed(self, listener: Instruments, method: str, exc: Exception) -> None:
        if any(found is listener for found in self._listeners):
            self._detach(listener)
            where = f"instruments:{type(listener).__name__}.{method}"
            log.warning("pulse: %s raised %s; the listener is detached (attach it again "
                        "once fixed)", where, type(exc).__name__)
            self.on_error(where, exc)

    def tick(self, number: int, duration_s: float) -> None:
        for listener in self._listeners:
            try:
                listener.tick(number, duration_s)
            except Exception as exc:
                self._failed(listener, "tick", exc)

    def dispatched(self, tag: str, latency_s: float) -> None:
        for listener in self._listeners:
            try:
                listener.dispatched(tag, latency_s)
            except Exception as exc:
                self._failed(listener, "dispatched", exc)

    def executed(self, tag: str, outcome: EffectOutcome, duration_s: float) -> None:
        for listener in self._listeners:
            try:
                listener.executed(tag, outcome, duration_s)
            except Exception as exc:
                self._failed(listener, "executed", exc)


def waited_s(entry: EffectEntry, now_ms: int) -> float:
    """How long (seconds, at `now_ms` on the engine's clock) the next attempt at `entry` has
    been due: since its `retry_at` while retrying, its lease's end while a claim holds it (a
    take-over; 0 when its owner died before), else its last event (its commit, or an
    operator's retry)."""
    if entry.status is EffectStatus.RETRYING:
        due = entry.retry_at
    elif entry.status is EffectStatus.EXECUTING:
        due = entry.lease_until
    else:
        due = entry.updated_at
    return max(0, now_ms - due) / 1000


async def timed_attempt(instruments: Instruments, tag: str,
                        attempt: Awaitable[EffectOutcome]) -> EffectOutcome:
    """Await a claimed `attempt` and tell `instruments` how it ended and how long it took."""
    started = time.perf_counter()
    try:
        outcome = await attempt
    except asyncio.CancelledError:
        instruments.executed(tag, EffectOutcome.INTERRUPTED, time.perf_counter() - started)
        raise
    instruments.executed(tag, outcome, time.perf_counter() - started)
    return outcome
