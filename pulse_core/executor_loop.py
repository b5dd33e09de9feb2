"""The ExecutorLoop: claims effects from the log with a lease, runs them, records the outcome.

Claims are appends of `effect-executing` that expect the effect's current version, so of two
loops (or two processes) racing for one attempt exactly one wins. The loop wakes at once on a
commit in its own process and reads the log every `scan_interval` for other writers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import psutil

from pulse_core.clock import Clock, SystemClock
from pulse_core.effects import (
    EFFECT_KINDS,
    EffectEntry,
    EffectOutcome,
    ExecutionContext,
    Executor,
    advance,
    decode_effect,
)
from pulse_core.errors import AppendRejected, PulseError, UnknownEffect, VersionConflict
from pulse_core.events import Event, EventDraft, encode_data, uuid7
from pulse_core.projector import load_checkpoint, save_checkpoint
from pulse_core.store.base import EventStore
from pulse_core.store.side import SideStore
from pulse_core.store.vitals import VitalsStore

_CHECKPOINT = "executor-loop"
_PAGE = 5_000
_CHECKPOINT_VERSION = 1


def _process_started(pid: int) -> float:
    """When process `pid` started, or 0.0 if there is none, or it is dead: a zombie with no
    thread left only waits for its parent to reap it."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE and process.num_threads() <= 1:
            return 0.0
        return float(process.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0


class ExecutorLoop:
    """Runs effects from `store` with `executors`, at most `concurrency` at a time."""

    def __init__(
        self,
        store: EventStore,
        executors: Sequence[Executor],
        *,
        clock: Clock | None = None,
        concurrency: int = 8,
        scan_interval: float = 1.0,
        lease_grace_ms: int = 5_000,
        checkpoints: Path | None = None,
        fail_unhandled: bool = True,
        vitals: VitalsStore | None = None,
        side: SideStore | None = None,
    ) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self.scan_interval = scan_interval
        self.lease_grace_ms = lease_grace_ms
        self.checkpoints = checkpoints
        self.fail_unhandled = fail_unhandled
        self.vitals = vitals
        self.side = side
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid7()[-12:]}"
        self._pid = os.getpid()
        self._started = _process_started(self._pid)
        self._host = socket.gethostname()
        self._by_tag: dict[str, Executor] = {}
        for executor in executors:
            for effect_type in executor.handles:
                tag = effect_type.tag()
                if tag in self._by_tag:
                    raise PulseError(
                        f"effect {tag!r} is handled by both {self._by_tag[tag].name} and "
                        f"{executor.name}; one executor per effect type"
                    )
                self._by_tag[tag] = executor
        self._slots = asyncio.Semaphore(concurrency)
        self._entries: dict[str, EffectEntry] = {}
        self._cursor = 0
        self._saved_cursor = 0
        self._inflight: dict[str, asyncio.Task[EffectOutcome]] = {}
        self._stopping = False
        self._refresh_lock = asyncio.Lock()
        if checkpoints is not None:
            loaded = load_checkpoint(checkpoints, _CHECKPOINT, _CHECKPOINT_VERSION,
                                     dict[str, EffectEntry])
            if loaded is not None:
                self._cursor = self._saved_cursor = loaded[0]
                self._entries = loaded[1]

    # -- the index of unfinished effects -----------------------------------------------------

    async def refresh(self) -> None:
        """Fold every effect event committed since the last refresh into the index."""
        async with self._refresh_lock:
            while True:
                top, page = await asyncio.to_thread(self._read_new)
                for event in page:
                    entry = advance(self._entries.get(event.key), event)
                    if entry is None:
                        self._entries.pop(event.key, None)
                    else:
                        self._entries[event.key] = entry
                    self._cursor = event.seq
                if len(page) < _PAGE:
                    self._cursor = max(self._cursor, top)
                    break

    def _read_new(self) -> tuple[int, list[Event]]:
        """The log's head and the effect events after the cursor: one trip to a thread."""
        top = self.store.last_seq_sync()
        if top <= self._cursor:
            return top, []
        return top, self.store.read_sync(self._cursor, kinds=EFFECT_KINDS, limit=_PAGE)

    def pending_dedup_keys(self) -> frozenset[str]:
        """Dedup keys of every effect not yet finished (pending, executing or retrying)."""
        return frozenset(entry.dedup for entry in self._entries.values())

    @property
    def unfinished(self) -> int:
        """How many effects are not yet acked or finally failed."""
        return len(self._entries)

    def _handles(self, entry: EffectEntry) -> bool:
        body = entry.data.get("effect") if isinstance(entry.data, dict) else None
        return isinstance(body, dict) and body.get("type") in self._by_tag

    def _claimable(self, entry: EffectEntry, now: int) -> bool:
        if entry.id in self._inflight:
            return False
        if not self.fail_unhandled and not self._handles(entry):
            return False  # another process's executors will take it
        if entry.status == "pending":
            return True
        if entry.status == "retrying":
            return entry.retry_at <= now
        if entry.lease_until <= now:
            return True
        return self._owner_gone(entry)

    def _owner_gone(self, entry: EffectEntry) -> bool:
        """A claim whose process on this host has died (or is a different process now)."""
        if entry.owner == self.owner or not entry.owner.startswith(f"{self._host}:"):
            return False
        if entry.owner_pid == self._pid and entry.owner_started == self._started:
            return False
        return _process_started(entry.owner_pid) != entry.owner_started

    def _next_due(self, now: int) -> float:
        due = [e.retry_at for e in self._entries.values() if e.status == "retrying"]
        due += [e.lease_until for e in self._entries.values() if e.status == "executing"]
        soonest = min((d for d in due if d > now), default=None)
        if soonest is None:
            return self.scan_interval
        return max(0.0, min(self.scan_interval, (soonest - now) / 1000))

    # -- running -----------------------------------------------------------------------------

    def dispatch(self) -> int:
        """Start an attempt for every claimable effect (up to the concurrency limit)."""
        if self._stopping:
            return 0
        now = self.clock.now_ms()
        started = 0
        for entry in list(self._entries.values()):
            if self._slots.locked():
                break
            if self._claimable(entry, now):
                # Claim at the version judged claimable now: `refresh` updates entries in
                # place while the attempt waits for a slot, and a claim expecting a later
                # version would take over another loop's live lease (or an acked effect).
                self._inflight[entry.id] = asyncio.create_task(
                    self._attempt(msgspec.structs.replace(entry)), name=f"pulse-effect-{entry.id}"
                )
                started += 1
        return started

    async def run(self) -> None:
        """Claim and run effects until cancelled or stopped."""
        signal = self.store.subscribe()
        try:
            while not self._stopping:
                signal.clear()
                await self.refresh()
                self.dispatch()
                self._maybe_checkpoint()
                timeout = self._next_due(self.clock.now_ms())
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await signal.wait()
        finally:
            self.store.unsubscribe(signal)

    async def run_until_idle(self) -> None:
        """Run everything claimable now, and what those runs make claimable, then return."""
        while True:
            await self.refresh()
            self.dispatch()
            if not self._inflight:
                return
            await asyncio.wait(list(self._inflight.values()))

    async def _attempt(self, entry: EffectEntry) -> EffectOutcome:
        async with self._slots:
            try:
                current = self._entries.get(entry.id)
                if current is None or current.version != entry.version:
                    return EffectOutcome.LOST_CLAIM  # moved on while this waited for a slot
                return await self._claim_and_run(entry)
            finally:
                self._inflight.pop(entry.id, None)

    async def _claim_and_run(self, entry: EffectEntry) -> EffectOutcome:
        attempt = entry.attempt + 1
        tag = entry.data.get("effect", {}).get("type") if isinstance(entry.data, dict) else None
        executor = self._by_tag.get(tag) if isinstance(tag, str) else None
        if executor is None and not self.fail_unhandled:
            return EffectOutcome.LOST_CLAIM
        timeout_ms = int((executor.timeout if executor else 0) * 1000)
        now = self.clock.now_ms()
        claim = EventDraft(
            "effect-executing", entry.id,
            {"attempt": attempt, "lease_until": now + timeout_ms + self.lease_grace_ms,
             "owner": self.owner, "pid": self._pid, "started": self._started},
            origin=f"executor:{executor.name if executor else 'loop'}", cause=entry.seq,
        )
        try:
            claimed = await self.store.append([claim], expect={entry.id: entry.version})
        except VersionConflict:
            return EffectOutcome.LOST_CLAIM
        version = claimed.events[0].version
        origin = claim.origin
        if executor is None:
            known = ", ".join(sorted(self._by_tag)) or "none"
            error = f"no executor handles effect {tag!r} (handled here: {known})"
            return await self._finish(entry, version=version, attempt=attempt, origin=origin,
                                      acked=None, error=error, final=True)
        try:
            effect = decode_effect(entry.data)
        except (UnknownEffect, msgspec.ValidationError) as exc:
            return await self._finish(entry, version=version, attempt=attempt, origin=origin,
                                      acked=None, error=str(exc), final=True)
        ctx = ExecutionContext(entry.id, attempt, entry.seq, origin, self.clock, self.store,
                               self.vitals, self.side)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(executor.timeout):
                result = await executor.execute(effect, ctx)
            encode_data(result, f"result of {executor.name}")
        except TimeoutError:
            error = f"{executor.name} timed out after {executor.timeout:g} s"
            final = attempt >= executor.max_attempts
            await self._finish(entry, version=version, attempt=attempt, origin=origin,
                               acked=None, error=error, final=final, executor=executor)
            return EffectOutcome.TIMED_OUT
        except asyncio.CancelledError:
            await asyncio.shield(self._finish(
                entry, version=version, attempt=attempt, origin=origin, acked=None,
                error="interrupted by engine shutdown", final=False, interrupted=True))
            raise
        except Exception as exc:
            error = "".join(traceback.format_exception_only(exc)).strip()
            final = attempt >= executor.max_attempts
            return await self._finish(entry, version=version, attempt=attempt, origin=origin,
                                      acked=None, error=error, final=final, executor=executor)
        duration = int((time.perf_counter() - started) * 1000)
        return await self._finish(entry, version=version, attempt=attempt, origin=origin,
                                  acked={"result": result, "duration_ms": duration}, error=None,
                                  final=True)

    async def _finish(
        self,
        entry: EffectEntry,
        *,
        version: int,
        attempt: int,
        origin: str,
        acked: dict[str, Any] | None,
        error: str | None,
        final: bool,
        interrupted: bool = False,
        executor: Executor | None = None,
    ) -> EffectOutcome:
        if acked is not None:
            draft = EventDraft("effect-acked", entry.id, {"attempt": attempt, **acked},
                               origin=origin, cause=entry.seq)
            outcome = EffectOutcome.ACKED
        else:
            data: dict[str, Any] = {"attempt": attempt, "error": error, "final": final}
            if not final:
                delay = 0 if interrupted or executor is None else executor.backoff.delay_ms(attempt)
                data["retry_at"] = self.clock.now_ms() + delay
            if interrupted:
                data["interrupted"] = True
            draft = EventDraft("effect-failed", entry.id, data, origin=origin, cause=entry.seq)
            outcome = (EffectOutcome.INTERRUPTED if interrupted
                       else EffectOutcome.FAILED if final else EffectOutcome.RETRY)
        try:
            await self.store.append([draft], expect={entry.id: version})
        except AppendRejected:
            # Our lease expired and another loop reclaimed the effect: its attempt stands.
            return EffectOutcome.LOST_CLAIM
        return outcome

    # -- lifecycle ---------------------------------------------------------------------------

    def _maybe_checkpoint(self, force: bool = False) -> None:
        if self.checkpoints is None:
            return
        if force or self._cursor - self._saved_cursor >= 10_000:
            save_checkpoint(self.checkpoints, _CHECKPOINT, _CHECKPOINT_VERSION, self._cursor,
                            self._entries)
            self._saved_cursor = self._cursor

    async def drain(self, deadline: float) -> int:
        """Stop claiming; wait up to `deadline` seconds for attempts in flight, then interrupt
        the rest (recorded as retryable failures, so they stay claimable). Returns how many
        were interrupted."""
        self._stopping = True
        running = list(self._inflight.values())
        if running:
            _, pending = await asyncio.wait(running, timeout=deadline)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            interrupted = len(pending)
        else:
            interrupted = 0
        await asyncio.to_thread(self._maybe_checkpoint, True)
        return interrupted
