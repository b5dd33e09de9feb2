"""One maintenance cycle: an activity of class `maintenance_cycle` that runs the steps of seed
004, section 5 (those pulse has), in order, and ends with its report.

The cycle's `cycle_start` is bound once, when its `activity-started` is written; a retry of the
same cycle (the effect retried, the engine restarted) finds that activity running and reuses
it, so a replayed sweep never decays an element twice, and a cycle that already ended returns
its stored report. A step that raises is a warning in the report and the cycle goes on; only a
failing store ends the cycle failed. The report counts what the log holds of the cycle (see
_work), every attempt's writes, and a resumed attempt's budgets start from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import msgspec

from pulse_adapters.maintenance._assessment import Assessment
from pulse_adapters.maintenance._consolidation import Proposer
from pulse_adapters.maintenance._context import (
    ABANDONED_AFTER,
    CYCLE_CLASS,
    CycleRun,
    Step,
    cycles_began,
    running_before,
)
from pulse_adapters.maintenance._ledger import CYCLES_KEY, CycleBegan
from pulse_adapters.maintenance._report import (
    CHANGED,
    NOTHING_TO_DO,
    Budget,
    CycleReport,
    health_signals,
)
from pulse_adapters.maintenance._settings import ORIGIN, PRINCIPAL, MaintenanceSettings
from pulse_adapters.maintenance._steps import STEPS, assessment, final_assessment
from pulse_adapters.maintenance._work import CycleTally, CycleWork
from pulse_core import (
    Clock,
    EventDraft,
    InvalidTransition,
    NotAuthorized,
    StoreError,
    SystemClock,
    VersionConflict,
    uuid7,
)
from pulse_core.maintenance import (
    Activity,
    ActivityBody,
    Authority,
    ElementsReader,
    activity_draft,
    activity_key,
    end_activity,
    read_activity,
)
from pulse_core.store import EventStore

log = logging.getLogger("pulse")


class CycleFailed(StoreError):
    """The store failed under a maintenance cycle; the cycle is recorded failed when the store
    still takes the record, else it stays running and its retry resumes it."""


async def previous_report(store: EventStore, before: str) -> CycleReport | None:
    """The report of the last completed cycle other than `before`, or None."""
    async for _, began in cycles_began(store):
        cycle = began.cycle
        if cycle == before:
            continue
        activity = await read_activity(store, cycle)
        if activity is not None and activity.status == "completed" and activity.report:
            try:
                return msgspec.convert(activity.report, CycleReport)
            except msgspec.ValidationError:
                continue
    return None


async def begin(store: EventStore, cycle: str, trigger: str, now: int) -> Activity:
    """The cycle's activity: found when it exists (a retry: its cycle_start is reused), else
    started now, with its `maintenance-cycle-began`, in one append."""
    existing = await read_activity(store, cycle)
    if existing is not None:
        return existing
    through = await store.last_seq()
    body = ActivityBody(activity_class=CYCLE_CLASS, status="running", actors=(PRINCIPAL,),
                        started_at=now, report={"trigger": trigger, "through_seq": through})
    began = EventDraft("maintenance-cycle-began", CYCLES_KEY, msgspec.to_builtins(
        CycleBegan(cycle=cycle, cycle_start=now, trigger=trigger, through_seq=through)),
        origin=ORIGIN)
    with contextlib.suppress(VersionConflict):  # the same cycle began concurrently: take it
        await store.append([activity_draft(cycle, body, origin=ORIGIN), began],
                           expect={activity_key(cycle): 0})
    started = await read_activity(store, cycle)
    assert started is not None
    return started


async def _report(run: CycleRun, status: str, health_from: Assessment) -> CycleReport:
    """The report: writes and changes as the log holds them for the cycle (every attempt's),
    the rest as this attempt found it."""
    work = await run.work.current()
    changes = {**work.changes, **{k: v for k, v in run.changes.items() if v}}
    changed = sum(changes.values())
    return CycleReport(
        cycle=run.cycle, status=status, trigger=run.trigger, cycle_start=run.cycle_start,
        ended_at=run.now, outcome=CHANGED if changed else NOTHING_TO_DO,
        reviewed=run.budget.reviewed, writes=work.writes, transactions=work.transactions,
        changes=dict(sorted(changes.items())),
        assessment=run.assessment, deferred=tuple(run.deferred),
        needed_authority=tuple(run.needed_authority), warnings=tuple(run.warnings),
        overdue=tuple(run.overdue), contested=tuple(run.contested),
        health=health_signals(health_from), steps=tuple(run.steps),
        consumed_through=run.consumed_through, through_seq=run.through_seq,
        swept_at=run.swept_at)


def _budget(settings: MaintenanceSettings, spent: CycleWork) -> Budget:
    """The cycle's budget less what its earlier attempts spent."""
    return Budget(settings.budgets, reviewed=spent.reviewed, writes=spent.writes,
                  transactions=spent.transactions)


def stored_report(activity: Activity) -> CycleReport:
    """The report an ended cycle activity holds (a bare one when it holds none)."""
    try:
        return msgspec.convert(activity.report, CycleReport)
    except (msgspec.ValidationError, TypeError):
        return CycleReport(cycle=activity.id, status=activity.status, trigger="",
                           cycle_start=activity.started_at,
                           ended_at=activity.ended_at or activity.started_at,
                           outcome=activity.reason or activity.status)


def _reader(store: EventStore, reader: ElementsReader | None) -> ElementsReader:
    if reader is None:
        return ElementsReader(store)
    if reader.store is not store:
        raise ValueError("run_cycle: `reader` reads another store than `store`")
    return reader


async def run_cycle(store: EventStore, settings: MaintenanceSettings | None = None, *,
                    cycle: str | None = None, trigger: str = "on-demand",
                    clock: Clock | None = None, authority: Authority | None = None,
                    proposer: Proposer | None = None, reader: ElementsReader | None = None,
                    steps: Sequence[tuple[str, Step]] | None = None) -> CycleReport:
    """Run maintenance cycle `cycle` (default: a new id) over the home behind `store` and
    return its report; the same `cycle` again resumes it if it is running, or returns its
    stored report if it ended. `proposer` proposes consolidated insights (None: the
    consolidation step does nothing). `reader` is an ElementsReader of `store` kept from an
    earlier cycle, so only what is new is folded (default: a new one, folding the whole log);
    a reader with a checkpoints folder is saved there once the steps ran, as the cycle ends.
    `steps` replaces the steps after assessment (tests).
    `authority` defaults to the settings' standing grants for the
    principal "maintenance" plus the grants humans issued in the log.

    Raises CycleFailed when the store fails (the cycle is recorded failed when it can be)."""
    settings = settings or MaintenanceSettings()
    clock = clock or SystemClock()
    cycle = cycle or f"maintenance-cycle-{uuid7()}"
    authority = authority or Authority(store, {PRINCIPAL: settings.grants})
    activity = await begin(store, cycle, trigger, clock.now_ms())
    if activity.status != "running":
        return stored_report(activity)
    started = activity.report if isinstance(activity.report, dict) else {}
    work = CycleTally(store, activity.seq)
    spent = await work.current()  # what earlier attempts wrote, if any
    run = CycleRun(store=store, settings=settings, cycle=cycle,
                   cycle_start=activity.started_at, trigger=str(started.get("trigger", trigger)),
                   through_seq=int(started.get("through_seq", 0)), clock=clock,
                   authority=authority, reader=_reader(store, reader),
                   budget=_budget(settings, spent),
                   previous=await previous_report(store, cycle),
                   began_seq=activity.seq, proposer=proposer, work=work)
    run.swept_at = run.previous.swept_at if run.previous is not None else None
    try:
        await _step(run, "close abandoned cycles", _close_abandoned, record=False)
        for name, step in [("assessment", assessment), *(STEPS if steps is None else steps)]:
            await _step(run, name, step)
        final = await _final(run)
    except StoreError as exc:
        return await _fail(run, exc)
    saving = asyncio.create_task(_checkpoint(run))  # written while the cycle ends
    try:
        return await _complete(run, final)
    finally:
        await saving


async def _complete(run: CycleRun, final: Assessment) -> CycleReport:
    """End the cycle completed with its report (the stored one when a concurrent run of
    this same cycle ended it first; failed when the store fails)."""
    try:
        report = await _report(run, "completed", final)
        await end_activity(run.store, run.cycle, "completed", ended_at=report.ended_at,
                           origin=ORIGIN, report=msgspec.to_builtins(report))
    except InvalidTransition:  # a concurrent run of this same cycle ended it first
        ended = await read_activity(run.store, run.cycle)
        assert ended is not None
        return stored_report(ended)
    except StoreError as exc:
        return await _fail(run, exc)
    return report


async def _checkpoint(run: CycleRun) -> None:
    """Save the elements' fold the steps read (only a cache: a disk that refuses costs a
    longer fold at the next engine start)."""
    try:
        await run.reader.checkpoint()
    except OSError as exc:
        log.warning("pulse: maintenance cycle %s could not checkpoint the elements' fold in "
                    "%s (%s): the next engine start folds more of the log", run.cycle,
                    run.reader.checkpoints, exc)


async def _close_abandoned(run: CycleRun) -> None:
    """End cancelled the cycles left running long past any attempt of theirs (their effect
    ran out of attempts): an activity never ends silently."""
    for stale in await running_before(run.store, run.abandoned_before,
                                      since_ms=run.closed_before):
        reason = (f"abandoned: still running {ABANDONED_AFTER} attempt timeouts after it "
                  f"began; cycle {run.cycle} took over")
        with contextlib.suppress(InvalidTransition):  # it ended meanwhile
            await end_activity(run.store, stale.id, "cancelled", ended_at=run.now,
                               origin=ORIGIN, reason=reason, cause=run.cause)
            run.budget.spend(writes=1, transactions=1)
            run.warnings.append(f"cycle {stale.id} was {reason}")


async def _step(run: CycleRun, name: str, step: Step, *, record: bool = True) -> None:
    """Run one step; a missing grant goes to needed_authority, anything else but a store
    failure becomes a warning, and the cycle goes on."""
    try:
        await step(run)
    except StoreError:
        raise
    except NotAuthorized as exc:  # a grant revoked mid-cycle: current governance applies
        run.needed_authority.append(f"{name}: {exc}")
    except Exception as exc:
        run.warnings.append(f"{name}: {type(exc).__name__}: {exc}")
    if record:
        run.steps.append(name)


async def _final(run: CycleRun) -> Assessment:
    """The final assessment; one that raises (but for the store) is a warning, and the
    report's health signals fall back to the first assessment: never a cycle left running."""
    try:
        return await final_assessment(run)
    except StoreError:
        raise
    except Exception as exc:
        run.warnings.append(f"final assessment: {type(exc).__name__}: {exc} (health signals "
                            "from the first assessment)")
        return run.assessment


async def _fail(run: CycleRun, exc: StoreError) -> CycleReport:
    """Record the cycle failed (the store is what failed); CycleFailed when even that fails,
    so the effect's retry resumes the running cycle."""
    run.warnings.append(f"store: {type(exc).__name__}: {exc}")
    try:
        report = await _report(run, "failed", run.assessment)
        await end_activity(run.store, run.cycle, "failed", ended_at=report.ended_at,
                           origin=ORIGIN, reason=f"{type(exc).__name__}: {exc}",
                           report=msgspec.to_builtins(report))
    except (StoreError, InvalidTransition):
        raise CycleFailed(f"maintenance cycle {run.cycle!r}: the store failed ({exc}); the "
                          "cycle stays running and its retry resumes it") from exc
    return report


def summary(report: CycleReport) -> dict[str, Any]:
    """The few fields an effect's result keeps (the whole report is in the activity)."""
    return {"cycle": report.cycle, "status": report.status, "outcome": report.outcome,
            "writes": report.writes, "changes": report.changes,
            "warnings": len(report.warnings), "healthy": report.healthy}
