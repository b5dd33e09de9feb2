"""process_watchdog and llm_watchdog: restart what died, with backoff and a budget."""

from __future__ import annotations

from typing import Any

import msgspec

from pulse_core import Backoff, Decision, Effect, Essential, Inner, Sample, Snapshot
from pulse_survival.config import LlmPolicy, ProcessPolicy
from pulse_survival.effects import Notify, RestartProcess, StopProcess
from pulse_survival.ledger import PendingRequest, ProcessRecord
from pulse_survival.marks import (
    GaveUp,
    LlmRestartScheduled,
    LlmRouteHealthy,
    Recovered,
    RequestHandled,
    StartFailed,
    StartHeld,
)
from pulse_survival.rules.base import SurvivalRule, counted, latest, ledger, streak_marks

HOUR_MS = 3_600_000


def restart_of(spec: Essential, reason: str, *, replace: bool = False,
               request: int | None = None) -> RestartProcess:
    """The restart effect for an essential process."""
    return RestartProcess(name=spec.name, argv=spec.argv, cwd=spec.cwd,
                          env_names=tuple(sorted(spec.env)), pidfile=spec.pidfile,
                          log=spec.log, reason=reason, replace=replace, request=request)


def answer(spec: Essential, pending: PendingRequest, now: int) -> list[Effect]:
    """What an operator's pending request about `spec` comes to: the mark that settles it and
    what executors do (a reset only makes the watchdog supervise it again)."""
    handled = RequestHandled(name=spec.name, request=pending.seq, action=pending.action,
                             at=now)
    who = pending.origin or "an operator"
    if pending.action == "stop":
        return [handled, StopProcess(name=spec.name, request=pending.seq,
                                     reason=f"stopped by {who}")]
    if pending.action in ("start", "restart") and spec.argv:
        verb = "started" if pending.action == "start" else "restarted"
        return [handled, restart_of(spec, f"{verb} by {who}", request=pending.seq,
                                    replace=pending.action == "restart")]
    return [handled]


def restart_backoff(initial_s: float, max_s: float) -> Backoff:
    """The policy's restart backoff: doubling from `initial_s` to `max_s`, without jitter, so
    every engine reading the same log waits the same."""
    return Backoff(initial_ms=int(initial_s * 1000), factor=2.0, max_ms=int(max_s * 1000),
                   jitter=0.0)


def _seen(sample: Sample, name: str) -> dict[str, Any] | None:
    """What `sample` says of process `name`, if it is a readable process-alive sample."""
    if not sample.ok or not isinstance(sample.data, dict):
        return None
    seen = sample.data.get(name)
    return seen if isinstance(seen, dict) else {}


class ProcessWatchdog(SurvivalRule):
    """An essential process is dead: restart it, with exponential backoff between restarts.

    As in supervisord, a restart that does not stay up `startsecs` is a failed start, and
    `startretries` failed starts in a row give up; so does spending `budget_per_hour`
    restarts within an hour. Giving up (and recovering later) is announced once. Every
    sample since the last tick is judged; the newest decides whether to restart. An
    operator's pending request (pulse_survival.control) is acted on first; a process an
    operator stopped is neither judged nor restarted until started again.
    """

    name = "process_watchdog"
    emits = (RestartProcess, Notify)

    def __init__(self, processes: tuple[Essential, ...], policy: ProcessPolicy) -> None:
        self.processes = processes
        self.policy = policy
        self.backoff = restart_backoff(policy.backoff_initial_s, policy.backoff_max_s)

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        samples = curr.since_last_tick("process-alive")
        newest = latest(curr, "process-alive")
        state = ledger(curr)
        added: list[Effect] = []
        for spec in self.processes:
            pending = state.process(spec.name).pending
            if pending is not None:  # the operator's word first; judged again next tick
                added += answer(spec, pending, curr.at)
                tick_ms = min(tick_ms, 1_000)
                continue
            if newest is None or state.process(spec.name).stopped:
                continue
            record, marks = self._judge(spec.name, state.process(spec.name), samples)
            decided, wish_ms = self._decide(spec, record, newest, curr.at)
            added += [*marks, *decided]
            tick_ms = tick_ms if wish_ms is None else min(tick_ms, wish_ms)
        return Decision([*effects, *added], tick_ms)

    def _judge(self, name: str, record: ProcessRecord, samples: tuple[Sample, ...]
               ) -> tuple[ProcessRecord, list[Effect]]:
        """Judge the last restart by every new sample: held (up `startsecs`) or failed."""
        last = record.restarts[-1] if record.restarts else None
        marks: list[Effect] = []
        failed, judged = record.failed_starts, record.judged
        for sample in samples:
            seen = _seen(sample, name)
            if seen is None or (last is not None and sample.ts <= last):
                continue  # unreadable, or taken before the last restart
            if seen.get("alive"):
                up_long = seen.get("uptime_s", 0) >= self.policy.startsecs
                if up_long and (failed or (last is not None and judged != last)):
                    marks.append(StartHeld(name=name, restart_at=last))
                    failed, judged = 0, (last if last is not None else judged)
            elif last is not None and judged != last:
                # dead again without having been seen up for startsecs: a failed start
                marks.append(StartFailed(name=name, restart_at=last))
                failed, judged = failed + 1, last
        return msgspec.structs.replace(record, failed_starts=failed, judged=judged), marks

    def _decide(self, spec: Essential, record: ProcessRecord, newest: Sample, now: int
                ) -> tuple[list[Effect], int | None]:
        """What to do about `spec` given its newest sample, and the tick it asks for."""
        seen = _seen(newest, spec.name)
        if seen is None:
            return [], None
        restarts = record.restarts
        last = restarts[-1] if restarts else None
        if seen.get("alive"):
            if record.given_up is None:
                return [], None
            pid = seen.get("pid")
            return [Recovered(name=spec.name, pid=pid),
                    Notify(topic=f"process:{spec.name}", level="recovered",
                           text=f"{spec.name} is alive again (pid {pid})")], None
        if record.given_up is not None or not spec.argv:
            return [], None
        if last is not None and newest.ts <= last:
            return [], None  # the sample predates the last restart: wait for a fresh one
        in_hour = sum(1 for ts in restarts
                      if now - ts < HOUR_MS and ts >= record.counted_from)
        failed = record.failed_starts
        if in_hour >= self.policy.budget_per_hour or failed >= self.policy.startretries:
            why = (f"{in_hour} restarts in the last hour" if in_hour >=
                   self.policy.budget_per_hour else f"{failed} failed starts in a row")
            return [GaveUp(name=spec.name, why=why),
                    Notify(topic=f"process:{spec.name}", level="given-up",
                           text=f"gave up restarting {spec.name}: {why}")], None
        backoff_ms = self.backoff.delay_ms(failed + 1)
        wait = last + backoff_ms - now if last is not None else 0
        if wait > 0:
            return [], max(wait, 100)
        return [restart_of(spec, "not running")], backoff_ms


class LlmWatchdog(SurvivalRule):
    """The LLM route probe failing `failures` times in a row: restart the model proxy.

    Reads the vitals key the adapters' route probe writes (data `{"ok": bool}`); restarts
    back off exponentially until the route is healthy again. Without a configured proxy it
    notifies instead.
    """

    name = "llm_watchdog"
    emits = (RestartProcess, Notify)

    def __init__(self, policy: LlmPolicy) -> None:
        self.policy = policy
        self.backoff = restart_backoff(policy.backoff_initial_s, policy.backoff_max_s)

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        samples = curr.since_last_tick(self.policy.route_key)
        if not samples:
            return Decision(effects, tick_ms)
        state = ledger(curr)
        before = streak = state.streak(self.name)
        restarts = state.llm.restarts
        added: list[Effect] = []
        for sample in samples:
            healthy = sample.ok and isinstance(sample.data, dict) and bool(sample.data.get("ok"))
            if healthy and restarts:
                restarts = 0
                added.append(LlmRouteHealthy())
            streak = counted(streak, not healthy, self.policy.failures)
        if streak >= self.policy.failures and curr.at >= state.llm.next_allowed_at:
            streak = 0
            restarts += 1
            next_allowed = curr.at + self.backoff.delay_ms(restarts)
            added.append(LlmRestartScheduled(count=restarts, next_allowed_at=next_allowed))
            text = f"LLM route failed {self.policy.failures} probes in a row"
            if self.policy.restart is None:
                added.append(Notify(topic="llm", level="warning",
                                    text=f"{text}; no proxy configured to restart"))
            else:
                # the proxy may be running, hung: a restart replaces it
                added.append(restart_of(self.policy.restart, text, replace=True))
        return Decision([*effects, *streak_marks(self.name, before, streak), *added], tick_ms)
