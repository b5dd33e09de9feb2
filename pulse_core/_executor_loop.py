"""The ExecutorLoop: claims effects from the log with a lease, runs them, records the outcome.

Claims are appends of `effect-executing` that expect the effect's key's version, so of two
loops (or processes) racing for one attempt exactly one wins; an event of another kind filed
under the key (an operator's note) moves the version, not the effect, and the claim or outcome
is written again expecting the key's new version. Each loop times a claim's lease on its own
clock (pulse_core._lease.Leases); an effect no executor here handles is left to the hosts that
announced its type (pulse_core._roster). While `run` runs, loops sharing a log take turns
(pulse_core._turns): each new effect is first left to one of them for a moment, so a fleet
does not queue N claims for each effect at the log's writer lock. The loop wakes at once on a
commit in its own process and reads the log every `scan_interval` for other writers.

A store that cannot be written for a while (a lock held past its busy timeout, a full disk,
a database restarting) never ends an attempt unobserved: the outcome is written again with
WRITE_BACKOFF while the attempt's lease holds (it expects the claim's version, so it lands at
most once), else left to the lease's expiry. Every such error goes to `on_error`, and the
outage once more, with its length, when the store answers again (so it reaches the log).
Neither a failed read nor a checkpoint the disk refuses ends `run`; errors are stored with
their URLs cut to scheme and host.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from pulse_core._attempts import Claim, claim_draft, ending, record_outcome
from pulse_core._backoff import Backoff
from pulse_core._clock import Clock, SystemClock
from pulse_core._effect_index import EffectIndex, foreign_head
from pulse_core._effects import (
    EffectEntry,
    EffectOutcome,
    EffectStatus,
    ExecutionContext,
    Executor,
    decode_effect,
    executors_by_tag,
)
from pulse_core._errors import (
    AppendOutcomeUnknown,
    StoreClosed,
    UnknownEffect,
    VersionConflict,
)
from pulse_core._events import EventDraft, encode_data
from pulse_core._instruments import Instruments, timed_attempt, waited_s
from pulse_core._lease import Leases, Owner
from pulse_core._principals import Principal
from pulse_core._roster import Roster, announcement
from pulse_core._supervisor import Reporter, StoreOutage, wait_signal
from pulse_core._turns import Turns
from pulse_core.store import EventStore, SideStore, VitalsStore

READ_BACKOFF = Backoff(initial_ms=100, factor=2.0, max_ms=5_000, jitter=0.1)
"""Spacing of `run`'s reads after the store failed one, and of claims after one failed."""

SCAN_GAP_S = 0.005
"""On a log that wakes its readers across processes (PostgreSQL), the least time from the end
of one of `run`'s reads of the log to the start of the next: the wakes of a busy shared log
(every commit of every engine sharing it wakes every loop) are taken together, one read for
all, however long a read takes. A loop woken after being idle longer reads at once; on a log
only this process wakes (SQLite), every wake reads at once."""

log = logging.getLogger("pulse.executor_loop")


def _log_error(where: str, exc: BaseException) -> None:
    log.error("%s: %s", where, exc, exc_info=exc)


class ExecutorLoop:
    """Runs effects from `store` with `executors`, at most `concurrency` at a time: it never
    claims more than it has free slots for, and claims nothing once `stop_claiming` (or
    `drain`) was called.

    `host` names its machine in its claims (default: the hostname): a claim from another host
    is taken over once its lease ends, one from this host also once its process is gone; an
    effect bound to another host is left to that host's engines. An effect no executor here
    handles is left to the hosts whose latest `executors-announced` runs its type; with
    `fail_unhandled` it is failed for good when none does (else left alone). `on_error(where,
    exc)` hears of every store error the loop survives (default: logged).
    """

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
        on_error: Reporter | None = None,
        host: str | None = None,
    ) -> None:
        self.store = store
        self.on_error: Reporter = on_error or _log_error
        self.clock: Clock = clock or SystemClock()
        self.scan_interval = scan_interval
        self.lease_grace_ms = lease_grace_ms
        self.checkpoints = checkpoints
        self.fail_unhandled = fail_unhandled
        self.vitals = vitals
        self.side = side
        #: told of each attempt's claim and end (the engine sets its instruments)
        self.instruments = Instruments()
        self._me = Owner.here(host)
        self.owner = self._me.id
        self.host = self._me.host
        self._by_tag = executors_by_tag(executors)
        #: what executors write through: never as a person (see Principal), whoever opened
        self._acting = (store.as_principal(Principal.engine()) if store.principal.is_human
                        else store)
        self.concurrency = concurrency
        self._index = EffectIndex(store, checkpoints)
        self._leases = Leases(self.clock)
        self._roster = Roster(store)
        self._turns = Turns(self.owner)
        self._taking_turns = False  # while `run` runs: run_until_idle claims all it can
        self._unhandled: set[str] = set()  # unfinished effects no executor here handles
        self._entries = self._index.entries
        self._inflight: dict[str, asyncio.Task[EffectOutcome]] = {}
        self._held_back: dict[str, tuple[int, float]] = {}  # claims that failed: count, until
        # the `lease_until` of each claim whose commit reply was lost, by effect id: that very
        # claim found in the log is no attempt under way, so it is claimed again (same
        # attempt) without waiting out its lease
        self._unknown_claims: dict[str, int] = {}
        self._wake: asyncio.Event | None = None  # run()'s signal, also set as a slot frees
        # Attempts that ended here, until a refresh begun after the end has read the log:
        # one begun before may not hold the attempt's claim, and its entry would look
        # claimable again (a claim sure to be refused). Effect id -> refreshes begun by then.
        self._refreshes = 0
        self._ended: dict[str, int] = {}
        self._checkpoint_failed = False
        self._stopping = False
        # on_error may be replaced after construction: the outage reports to the current one
        self._outage = StoreOutage("executor-loop", self.owner,
                                   lambda where, exc: self.on_error(where, exc))  # noqa: PLW0108

    # -- the index of unfinished effects -----------------------------------------------------

    async def refresh(self) -> None:
        """Fold every effect event committed since the last refresh into the index."""
        self._refreshes += 1
        begun = self._refreshes
        await self._index.refresh()
        for ended in [i for i, during in self._ended.items() if during < begun]:
            del self._ended[ended]  # this refresh read the log after the attempt ended
        at = asyncio.get_running_loop().time()
        now_ms = self.clock.now_ms()
        for (tag, owner), stamp in self._index.take_claims().items():
            # when it claimed, on this loop's clock: a claim replayed from long ago (at a
            # start, from the log or a checkpoint's tail) is no sign of a loop there now
            self._turns.seen(tag, owner, at - max(0, now_ms - stamp) / 1000)
        self._turns.keep(self._entries, at)
        changed = self._index.take_changed()
        self._leases.observe(self._entries, changed)
        for effect_id in changed:
            entry = self._entries.get(effect_id)
            if entry is None or entry.tag in self._by_tag:
                self._unhandled.discard(effect_id)
            else:
                self._unhandled.add(effect_id)
        for gone in [i for i in self._held_back if i not in self._entries]:
            del self._held_back[gone]
        if self.fail_unhandled and self._unhandled:
            await self._roster.refresh()  # read only when an effect may be another host's

    def announcement(self) -> EventDraft:
        """The `executors-announced` event saying which effect types this loop's host runs
        (the engine records it as it opens)."""
        return announcement(self.host, self.owner, self._by_tag)

    def pending_dedup_keys(self) -> frozenset[str]:
        """Dedup keys of every unfinished effect that may run on this loop's host."""
        return self._index.dedup_keys(self.host)

    @property
    def unfinished(self) -> int:
        """How many effects are not yet acked, finally failed or cancelled."""
        return len(self._entries)

    def _claimable(self, entry: EffectEntry, now: int) -> bool:
        if entry.id in self._inflight or entry.id in self._ended \
                or entry.host not in ("", self.host):
            return False  # running here (or ended since the last read), or bound elsewhere
        held = self._held_back.get(entry.id)
        if held is not None and asyncio.get_running_loop().time() < held[1]:
            return False
        if entry.tag not in self._by_tag and not self._fails_unhandled(entry):
            return False  # another host's executors will take it
        if entry.status is EffectStatus.PENDING:
            return self._my_turn(entry)
        if entry.status is EffectStatus.RETRYING:
            return entry.retry_at <= now and self._my_turn(entry)
        return (self._leases.ended(entry) or self._me.outlived(entry)
                or self._lost_claim(entry))

    def _my_turn(self, entry: EffectEntry) -> bool:
        """Whether this loop is the one to claim `entry` now (pulse_core._turns), while
        `run` runs; an effect bound to a host, or one no executor here handles, is claimed
        by whoever sees it, and `run_until_idle` claims whatever it can."""
        if not self._taking_turns or entry.host or entry.tag not in self._by_tag:
            return True
        return self._turns.mine(entry, asyncio.get_running_loop().time())

    def _lost_claim(self, entry: EffectEntry) -> bool:
        """Whether `entry` is held by a claim of this loop's whose commit reply was lost."""
        return (entry.status is EffectStatus.EXECUTING and entry.owner == self._me.id
                and self._unknown_claims.get(entry.id) == entry.lease_until)

    def _fails_unhandled(self, entry: EffectEntry) -> bool:
        """Whether to fail `entry`, which no executor here handles, for good: with
        `fail_unhandled`, when no host (its own, if bound to one) announced its type."""
        return self.fail_unhandled and not self._roster.runners(entry.tag, entry.host)

    def _next_due(self, now: int) -> float:
        soonest = self._index.next_due(now)
        wait = self.scan_interval if soonest is None else (soonest - now) / 1000
        clock = asyncio.get_running_loop().time()
        held = min((until for _, until in self._held_back.values() if until > clock), default=None)
        if held is not None:
            wait = min(wait, held - clock)
        lease = self._leases.next_end_s()
        if lease is not None:
            wait = min(wait, lease)
        turn = self._turns.next_s(clock)
        if turn is not None:
            wait = min(wait, turn)
        return max(0.0, min(self.scan_interval, wait))

    # -- running -----------------------------------------------------------------------------

    def dispatch(self) -> int:
        """Start an attempt for claimable effects, as many as there are free slots."""
        if self._stopping:
            return 0
        now = self.clock.now_ms()
        started = 0
        for entry in list(self._entries.values()):
            if len(self._inflight) >= self.concurrency:
                break
            if self._claimable(entry, now):
                # Claim at the version judged claimable now: `refresh` updates entries in
                # place before the attempt starts, and a claim expecting a later version
                # would take over another loop's live lease (or an acked effect).
                self._inflight[entry.id] = asyncio.create_task(
                    self._attempt(msgspec.structs.replace(entry)), name=f"pulse-effect-{entry.id}"
                )
                started += 1
        return started

    async def run(self) -> None:
        """Claim and run effects until cancelled or stopped.

        A read the store fails is reported to `on_error` and tried again after READ_BACKOFF;
        attempts in flight carry on meanwhile. Only a closed store ends the loop.
        """
        signal = self._wake = self.store.subscribe()
        scan_gap = SCAN_GAP_S if self.store.wakes_across_processes else 0.0
        failures = 0
        self._taking_turns = True
        try:
            while not self._stopping:
                signal.clear()
                try:
                    await self.refresh()
                    self.dispatch()
                except StoreClosed:
                    raise
                except Exception as exc:
                    failures += 1
                    self._outage.failed("executor-loop", exc)
                    await asyncio.sleep(READ_BACKOFF.delay_ms(failures) / 1000)
                    continue
                failures = 0
                self._outage.answered()
                await self._checkpoint(force=False)
                read_end = asyncio.get_running_loop().time()
                await wait_signal(signal, self._next_due(self.clock.now_ms()))
                gap = read_end + scan_gap - asyncio.get_running_loop().time()
                if gap > 0:
                    await asyncio.sleep(gap)
        finally:
            self._taking_turns = False
            self._wake = None
            self.store.unsubscribe(signal)

    async def _checkpoint(self, *, force: bool) -> None:
        """Save the index when due (`force`: now, at drain); a save that fails is reported
        once until one succeeds again: the checkpoint is a cache, claims go on without it."""
        try:
            saved = await self._index.checkpoint(force)
        except Exception as exc:
            if not self._checkpoint_failed:
                self.on_error("executor-loop: checkpoint not saved; the index is rebuilt from "
                              "the log at the next start", exc)
            self._checkpoint_failed = True
        else:  # a save put off (nothing due, or the index moved on) ends no failure episode
            self._checkpoint_failed = self._checkpoint_failed and not saved

    async def run_until_idle(self) -> None:
        """Run everything claimable now, and what those runs make claimable, then return
        (with every outcome folded into the index)."""
        while True:
            # Attempts may finish while a refresh reads: only a refresh begun with none in
            # flight has seen every outcome, so only after one may this return.
            settled = not self._inflight
            await self.refresh()
            self.dispatch()  # a freed slot takes the next effect the index knows of
            if not self._inflight:
                if settled:
                    return
                continue
            await asyncio.wait(list(self._inflight.values()),
                               return_when=asyncio.FIRST_COMPLETED)

    def stop_claiming(self) -> None:
        """Claim nothing more; attempts already claimed run on."""
        self._stopping = True

    async def _attempt(self, entry: EffectEntry) -> EffectOutcome:
        # this loop's own claim whose reply was lost never ran: claimed again, same attempt
        attempt = entry.attempt + (0 if self._lost_claim(entry) else 1)
        try:
            current = self._entries.get(entry.id)
            if current is None or current.version != entry.version:
                return EffectOutcome.LOST_CLAIM  # moved on since it was dispatched
            return await self._claim_and_run(entry, attempt)
        except Exception as exc:
            # The claim could not be written: nothing ran and nothing is lost; the effect
            # is tried again once READ_BACKOFF has passed (if it was written after all, its
            # reply lost, this loop's own claim does not hold it back).
            self._hold_back(entry.id)
            self._outage.failed(f"executor-loop: attempt {attempt} of effect {entry.id}", exc)
            return EffectOutcome.LOST_CLAIM
        finally:
            self._inflight.pop(entry.id, None)
            self._ended[entry.id] = self._refreshes
            if self._wake is not None:
                self._wake.set()  # a slot is free: claim what waits for one

    def _hold_back(self, effect_id: str) -> None:
        """Claim `effect_id` again only after READ_BACKOFF (longer after each failure)."""
        failures = self._held_back.get(effect_id, (0, 0.0))[0] + 1
        delay = READ_BACKOFF.delay_ms(failures) / 1000
        self._held_back[effect_id] = (failures, asyncio.get_running_loop().time() + delay)

    async def _claim_and_run(self, entry: EffectEntry, attempt: int) -> EffectOutcome:
        """Claim attempt number `attempt` at `entry` and run it."""
        executor = self._by_tag.get(entry.tag)
        if executor is None and not self._fails_unhandled(entry):
            return EffectOutcome.LOST_CLAIM
        now = self.clock.now_ms()
        lease_ms = int((executor.timeout if executor else 0) * 1000) + self.lease_grace_ms
        draft = claim_draft(entry, self._me, now + lease_ms,
                            f"executor:{executor.name if executor else 'loop'}", lease_ms=lease_ms,
                            attempt=attempt)
        expected: int | None = entry.version
        while expected is not None:
            if self._stopping:  # drain began after this attempt was dispatched
                return EffectOutcome.LOST_CLAIM
            try:
                claimed = await self.store.append([draft], expect={entry.id: expected})
                break
            except VersionConflict:
                expected = await foreign_head(self.store, entry.id, expected)
            except AppendOutcomeUnknown:
                for settled in self._unknown_claims.keys() - self._entries.keys():
                    del self._unknown_claims[settled]
                self._unknown_claims[entry.id] = int(draft.data["lease_until"])
                raise
        else:  # another claim won; never retried at once (no busy loop)
            self._hold_back(entry.id)
            return EffectOutcome.LOST_CLAIM
        self._held_back.pop(entry.id, None)
        self._unknown_claims.pop(entry.id, None)
        self._outage.answered()
        claim = Claim(entry, claimed.events[0].version, now + lease_ms, attempt, draft.origin,
                      executor)
        self.instruments.dispatched(entry.tag, waited_s(entry, self.clock.now_ms()))
        return await timed_attempt(self.instruments, entry.tag, self._run(claim))

    async def _run(self, claim: Claim) -> EffectOutcome:
        """Run the attempt `claim` opened, and record how it ended."""
        entry, executor = claim.entry, claim.executor
        if executor is None:
            return await self._finish(claim, error=self._roster.unhandled(
                entry.id, entry.tag, entry.host, self.host, self._by_tag))
        try:
            effect = decode_effect(entry.data)
        except (UnknownEffect, msgspec.ValidationError) as exc:
            return await self._finish(claim, error=str(exc))
        ctx = ExecutionContext(entry.id, claim.attempt, entry.seq, claim.origin, self.clock,
                               self._acting, self.vitals, self.side)
        last = claim.attempt - entry.attempts_before_retry >= executor.max_attempts
        started = time.perf_counter()
        try:
            async with asyncio.timeout(executor.timeout):
                result = await executor.execute(effect, ctx)
            encode_data(result, f"result of {executor.name}")
        except TimeoutError:
            error = f"{executor.name} timed out after {executor.timeout:g} s"
            await self._finish(claim, error=error, final=last)
            return EffectOutcome.TIMED_OUT
        except asyncio.CancelledError:
            await asyncio.shield(self._finish(claim, error="interrupted by engine shutdown",
                                              final=False, interrupted=True))
            raise
        except Exception as exc:
            error = "".join(traceback.format_exception_only(exc)).strip()
            return await self._finish(claim, error=error, final=last)
        duration = int((time.perf_counter() - started) * 1000)
        return await self._finish(claim, acked={"result": result, "duration_ms": duration})

    async def _finish(self, claim: Claim, *, acked: dict[str, Any] | None = None,
                      error: str = "", final: bool = True, interrupted: bool = False
                      ) -> EffectOutcome:
        """Record how `claim`'s attempt ended (see `ending`); LOST_CLAIM if it was not."""
        draft, outcome = ending(claim, self.clock.now_ms(), acked=acked, error=error,
                                final=final, interrupted=interrupted)
        written = await record_outcome(self.store, claim, draft, clock=self.clock,
                                       outage=self._outage, on_error=self.on_error)
        return outcome if written else EffectOutcome.LOST_CLAIM

    # -- lifecycle ---------------------------------------------------------------------------

    async def drain(self, deadline: float) -> int:
        """Stop claiming; wait up to `deadline` seconds for attempts in flight, then interrupt
        the rest (recorded as retryable failures, so they stay claimable). Returns how many
        were interrupted."""
        self.stop_claiming()
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
        await self._checkpoint(force=True)
        return interrupted
