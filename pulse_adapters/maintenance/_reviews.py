"""The review steps of a maintenance cycle (seed 004, section 5, steps 7 to 14):
contradictions, derivations, commitments, watches and retention. Each reads the cycle's
census, writes through a pulse_core building block and charges the cycle's budget."""

from __future__ import annotations

from collections import defaultdict

import msgspec

from pulse_adapters.maintenance._assessment import contested_slots
from pulse_adapters.maintenance._context import REVIEW_DERIVED, CycleRun
from pulse_adapters.maintenance._settings import ORIGIN, PRINCIPAL
from pulse_core import EventDraft, InvalidTransition, NotAuthorized, StoreError, VersionConflict
from pulse_core.maintenance import (
    Beliefs,
    RetentionLadder,
    SleepBoard,
    SleepTasks,
    Watches,
    evaluate_watches,
)
from pulse_core.memory import ObservationRecorded, identity_key

WATCH_EVENTS = 200_000
"""The most events one cycle's watch evaluation reads; the next cycle goes on from there."""

# -- 7/8/9. contradictions, derivations, commitments -----------------------------------------


async def contradictions(run: CycleRun) -> None:
    """7. Contested belief slots are counted and listed: a finding, never a deletion."""
    beliefs = await run.fold(Beliefs())
    run.contested = contested_slots(beliefs, (await run.census()).corrected) if beliefs else []


async def derivations(run: CycleRun) -> None:
    """8. Roots revised since the last cycle: their dependents (depth-bounded) get a stale
    flag and a review_derived sleep task. Stale never retracts or hides anything."""
    if not await run.allowed("maintain", "flag derived items stale"):
        return
    roots = [e for e in (await run.census()).revised if (e.revised_seq or 0) > run.since_seq]
    ladder = RetentionLadder(run.store, run.reader, run.authority, PRINCIPAL, origin=ORIGIN,
                             clock=run.clock, cause=run.cause)
    for index, root in enumerate(roots):
        if not run.budget.allows(writes=10, transactions=2) or not run.budget.review(1):
            run.deferred.append(f"derivation review: {len(roots) - index} revised roots left "
                                "(budget)")
            break
        flagged = await ladder.mark_stale(root.id, reason=f"root revised at seq "
                                                          f"{root.revised_seq}")
        if flagged:
            run.budget.spend(writes=len(flagged) + 1, transactions=1)
    await _review_tasks(run)


async def _review_tasks(run: CycleRun) -> None:
    """A review_derived task for every stale flag that has none yet (flagged by this cycle,
    by a cycle cut short before it made the task, or by an evidence correction). A flag whose
    task cannot be made (a malformed root, say) is a warning; the others go on."""
    stale = (await run.census()).stale
    if not stale:
        return
    state = await run.reader.current()
    tasks = await run.fold(SleepTasks())
    board = SleepBoard(run.store, ORIGIN, clock=run.clock, cause=run.cause)
    for eid in stale:
        element = state.elements.get(eid)
        for root in element.stale_roots if element is not None else ():
            task_id = f"{REVIEW_DERIVED}:{eid}:{root}"
            if task_id in tasks:
                continue
            if not run.budget.allows(writes=1, transactions=1):
                run.deferred.append("derivation review: review tasks left (budget)")
                return
            try:
                await board.create(REVIEW_DERIVED, task_id=task_id, subject=eid,
                                   assigned_to=PRINCIPAL, reason=f"root {root} revised")
            except VersionConflict:
                continue  # another cycle made it meanwhile
            except (StoreError, NotAuthorized):
                raise
            except Exception as exc:  # a poisoned flag: skip it, review the others
                run.warnings.append(f"derivation review: no review task for {eid} (root "
                                    f"{_clip(root)}): {type(exc).__name__}: {_clip(str(exc))}")
                continue
            run.budget.spend(writes=1, transactions=1)


def _clip(text: str, at: int = 120) -> str:
    return text if len(text) <= at else f"{text[:at]}... ({len(text)} chars)"


async def commitments(run: CycleRun) -> None:
    """9. Overdue pending or blocked commitments are surfaced, once each, as a warning
    observation on their identity (and listed in the report); never expired."""
    due = (await run.census()).overdue
    state = await run.reader.current()
    run.overdue = [e.id for e in due]
    fresh: dict[str, list[EventDraft]] = defaultdict(list)
    for e in due:
        record = f"o-overdue-{e.record}"
        if f"{e.identity}/{record}" in state.elements:
            continue  # surfaced by an earlier cycle
        c = e.commitment
        assert c is not None
        body = ObservationRecorded(
            record=record, source="maintenance", key="commitment-overdue",
            value={"commitment": e.id, "text": c.text, "due_at": c.due_at,
                   "status": c.status}, severity="warning", routine=False)
        fresh[e.identity].append(EventDraft(
            "observation-recorded", identity_key(e.identity), msgspec.to_builtins(body),
            origin=ORIGIN, idem=f"maintenance:overdue:{e.id}", cause=run.cause))
    if fresh and not await run.allowed("maintain", "surface overdue commitments"):
        return
    for drafts in fresh.values():
        if not run.budget.allows(writes=len(drafts)):
            run.deferred.append("commitment review: overdue notices left (budget)")
            return
        await run.append(drafts)


# -- 10. watches -----------------------------------------------------------------------------


async def watches(run: CycleRun) -> None:
    """10. Watch evaluation from the durable change cursor (the last completed cycle's
    `consumed_through`): delta watches fire on a matching change, silence watches once the
    cursor has consumed the log through their due time. Fires are keyed: never twice."""
    after = run.previous.consumed_through if run.previous is not None else 0
    run.consumed_through = after
    if not await run.allowed("maintain", "evaluate watches"):
        return
    head = await run.store.last_seq()
    watching = await run.fold(Watches())
    if not any(w.status == "armed" for w in watching.values()):
        run.consumed_through = max(after, head)  # nothing armed: nothing can match
        return
    result = await evaluate_watches(run.store, watching, after, run.now, origin=ORIGIN,
                                    max_events=WATCH_EVENTS, cause=run.cause)
    run.consumed_through = result.consumed_through
    if not result.complete:
        run.deferred.append(f"watch evaluation: read through seq {result.consumed_through:,} "
                            f"of {head:,} ({WATCH_EVENTS:,} events a cycle); the next cycle "
                            "reads on from there")
    fired = len(result.fired)
    run.budget.spend(writes=3 * fired + len(result.satisfied),
                     transactions=fired + len(result.satisfied))


# -- 14. retention ---------------------------------------------------------------------------


async def retention(run: CycleRun) -> None:
    """14. Archive consolidated exchanges at the decay floor past `archive_after_days`,
    through the retention ladder with maintenance's grants; one somebody restored stays
    active. Purge is never automatic: tombstoned elements are reported as purge candidates
    for a human."""
    settings = run.settings
    found = await run.census()
    restored = await run.restored()
    candidates = [e for e in found.candidates if e.id not in restored]
    tombstoned = found.counts.get("tombstoned", 0)
    if tombstoned:
        run.deferred.append(f"retention: {tombstoned} tombstoned elements are purge "
                            "candidates — purge is never automatic: a human purges")
    if not candidates or not await run.allowed(
            "archive", f"archive {len(candidates)} consolidated exchanges at the floor"):
        return
    ladder = RetentionLadder(run.store, run.reader, run.authority, PRINCIPAL, origin=ORIGIN,
                             clock=run.clock, cause=run.cause)
    for index, element in enumerate(candidates):
        if not run.budget.allows(writes=2) or not run.budget.review(1):
            run.deferred.append(f"retention: {len(candidates) - index} archive candidates "
                                "left (budget)")
            return
        try:
            await ladder.archive(element.id, reason=f"consolidated, at the decay floor, "
                                                    f"older than "
                                                    f"{settings.retention.archive_after_days:g}"
                                                    " days")
        except InvalidTransition:
            continue  # archived, restored or removed meanwhile: its state is someone's choice
        run.budget.spend(writes=2, transactions=1)


