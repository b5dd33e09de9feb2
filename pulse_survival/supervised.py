"""Each essential process as supervisorctl shows it: RUNNING, STARTING, BACKOFF, FATAL.

A state is computed, never stored: from what a tick sees (the survival ledger in a snapshot,
and the newest `process-alive` sample) and the process watchdog's settings, so the daemon's
status file, the web UI and a test all say the same thing of the same log.
`supervised_states(snapshot, processes, policy)` works on any snapshot;
`process_states(engine)` takes a running engine's snapshot and its survival settings.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from pulse_core import Essential, Layer, Sample, Snapshot
from pulse_survival.config import ProcessPolicy
from pulse_survival.ledger import ProcessRecord, SurvivalLedger, SurvivalLedgerData
from pulse_survival.rules import HOUR_MS, ProcessWatchdog, restart_backoff

if TYPE_CHECKING:
    from pulse_core import Engine

ALIVE_KEY = "process-alive"
"""The vitals key of the process watcher's samples."""


class SupervisedState(enum.Enum):
    """Where an essential process is, in supervisorctl's words."""

    RUNNING = "RUNNING"
    """Alive, and up for at least the policy's `startsecs`."""
    STARTING = "STARTING"
    """Restarted (or come up) less than `startsecs` ago, or restarted and not seen since."""
    BACKOFF = "BACKOFF"
    """Dead; the watchdog restarts it once its backoff has passed."""
    FATAL = "FATAL"
    """Dead, and the watchdog gave up restarting it (`given_up_why` says why)."""
    EXITED = "EXITED"
    """Dead, and nothing restarts it: it has no `argv`."""
    STOPPED = "STOPPED"
    """Stopped by an operator: not restarted until an operator starts it again."""
    UNKNOWN = "UNKNOWN"
    """No readable `process-alive` sample of it yet (or none recent)."""


class ProcessState(msgspec.Struct, frozen=True, kw_only=True):
    """One essential process at `at` (engine clock, ms).

    `pid` and `uptime_s` are set while it runs; `restarts_last_hour` counts the watchdog's
    restarts in the hour before `at`, `last_restart_at` is the newest one; `failed_starts`
    the restarts in a row that did not stay up `startsecs`; `given_up_why` why the watchdog
    stopped restarting it (None while it restarts it); `next_restart_at` the earliest the
    next restart comes, while it is in BACKOFF after an earlier restart; `sampled_at` when
    the sample it was judged by was taken; `pending` the operator's request not yet acted on
    (`start`, `stop`, `restart`, `reset`) and `asked_by` who asked for it.
    """

    name: str
    state: SupervisedState
    at: int
    pid: int | None = None
    uptime_s: float | None = None
    restarts_last_hour: int = 0
    last_restart_at: int | None = None
    failed_starts: int = 0
    given_up_why: str | None = None
    next_restart_at: int | None = None
    sampled_at: int | None = None
    pending: str | None = None
    asked_by: str | None = None


def _seen(sample: Sample | None, name: str) -> dict[str, Any] | None:
    """What `sample` says of process `name`; None when there is no readable word of it."""
    if sample is None or not sample.ok or not isinstance(sample.data, dict):
        return None
    seen = sample.data.get(name)
    return seen if isinstance(seen, dict) else None


def _state_of(spec: Essential, record: ProcessRecord, sample: Sample | None,
              policy: ProcessPolicy, now: int) -> ProcessState:
    restarts = record.restarts
    last = restarts[-1] if restarts else None
    known = ProcessState(
        name=spec.name, state=SupervisedState.UNKNOWN, at=now,
        restarts_last_hour=sum(1 for ts in restarts if now - ts < HOUR_MS),
        last_restart_at=last, failed_starts=record.failed_starts,
        given_up_why=record.given_up, sampled_at=None if sample is None else sample.ts,
        pending=None if record.pending is None else record.pending.action,
        asked_by=None if record.pending is None else record.pending.origin)
    seen = _seen(sample, spec.name)
    if seen is None or sample is None:
        return known
    if last is not None and sample.ts <= last:  # restarted since: the new one is not seen yet
        return msgspec.structs.replace(known, state=SupervisedState.STARTING)
    if seen.get("alive"):
        pid = seen.get("pid")
        uptime = float(seen.get("uptime_s") or 0.0) + max(now - sample.ts, 0) / 1000
        state = SupervisedState.RUNNING if uptime >= policy.startsecs else \
            SupervisedState.STARTING
        return msgspec.structs.replace(known, state=state, uptime_s=round(uptime, 3),
                                       pid=pid if isinstance(pid, int) else None)
    if record.stopped:
        return msgspec.structs.replace(known, state=SupervisedState.STOPPED)
    if record.given_up is not None:
        return msgspec.structs.replace(known, state=SupervisedState.FATAL)
    if not spec.argv:
        return msgspec.structs.replace(known, state=SupervisedState.EXITED)
    backoff = restart_backoff(policy.backoff_initial_s, policy.backoff_max_s)
    next_at = None if last is None else last + backoff.delay_ms(record.failed_starts + 1)
    return msgspec.structs.replace(known, state=SupervisedState.BACKOFF, next_restart_at=next_at)


def supervised_states(snapshot: Snapshot, processes: Sequence[Essential],
                      policy: ProcessPolicy) -> list[ProcessState]:
    """Each of `processes` as of `snapshot` (its survival ledger and its newest process-alive
    sample), judged with `policy` as the process watchdog judges it, in the order given."""
    ledger = snapshot.projections.get(SurvivalLedger.name)
    reading = snapshot.vital(ALIVE_KEY)
    return judged_states(ledger if isinstance(ledger, SurvivalLedgerData) else None,
                         None if reading is None else reading.sample, processes, policy,
                         snapshot.at)


def judged_states(ledger: SurvivalLedgerData | None, sample: Sample | None,
                  processes: Sequence[Essential], policy: ProcessPolicy,
                  now: int) -> list[ProcessState]:
    """Each of `processes` at `now`, from the survival `ledger` and the `process-alive`
    `sample` (the newest), judged with `policy`, in the order given."""
    ledger = ledger or SurvivalLedgerData()
    return [_state_of(spec, ledger.process(spec.name), sample, policy, now)
            for spec in processes]


def watchdog_of(engine: Engine) -> ProcessWatchdog | None:
    """The process watchdog among `engine`'s survival rules (None: it has none)."""
    return watchdog_in(engine.survival)


def watchdog_in(layer: Layer) -> ProcessWatchdog | None:
    """The process watchdog among the rules of the survival `layer` (None: it has none)."""
    return next((r for r in layer.rules if isinstance(r, ProcessWatchdog)), None)


async def process_states(engine: Engine) -> list[ProcessState]:
    """Each essential process of the open `engine`, as of a snapshot taken now, judged by the
    settings its survival layer runs with ([] when it has none configured). Safe to call
    while the engine ticks: a snapshot only reads."""
    watchdog = watchdog_of(engine)
    if watchdog is None or not watchdog.processes:
        return []
    return supervised_states(await engine.snapshot(), watchdog.processes, watchdog.policy)
