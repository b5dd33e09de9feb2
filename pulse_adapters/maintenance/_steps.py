"""The steps of a maintenance cycle, in the seed's order (section 5), each a function of the
cycle's shared CycleRun: assessment, sleep tasks, consolidation, skill verdicts and
metabolism here, the reviews in _reviews. Every write goes through a building block of
pulse_core (sleep-task claims, the decay sweep) and is charged to the
cycle's budget; what does not fit is reported as deferred.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import msgspec

from pulse_adapters.maintenance._assessment import Assessment, assess
from pulse_adapters.maintenance._consolidation import consolidate
from pulse_adapters.maintenance._context import (
    HANDLED,
    REVIEW_DERIVED,
    WATCH_REVIEW,
    CycleRun,
    Restored,
    Step,
    claims,
    last_swept,
    overlapping_cycles,
)
from pulse_adapters.maintenance._imports import ImportReviews, flagged_count, imported_review
from pulse_adapters.maintenance._reviews import (
    commitments,
    contradictions,
    derivations,
    retention,
    watches,
)
from pulse_adapters.maintenance._self_model import self_model
from pulse_adapters.maintenance._settings import ORIGIN, PRINCIPAL
from pulse_adapters.maintenance._skill_health import skill_health
from pulse_adapters.maintenance._skills import SkillBoard
from pulse_adapters.maintenance._working_state import working_state
from pulse_core import NotAuthorized, StoreError
from pulse_core.maintenance import (
    Beliefs,
    DecayPolicy,
    ElementsState,
    SleepBoard,
    SleepTask,
    SleepTasks,
    SweepReport,
    Watches,
    authority_key,
    claimable,
    decays,
    eligible_for_decay,
    read_watch,
    sweep,
)

CONSOLIDATION_MIN_AGE_MS = 3_600_000


_TASKS, _BELIEFS, _WATCHES, _RESTORED, _REVIEWS = (
    SleepTasks(), Beliefs(), Watches(), Restored(), ImportReviews())


async def _assess(run: CycleRun) -> Assessment:
    found = await run.census()
    folded = await run.folds(_TASKS, _BELIEFS, _WATCHES, _RESTORED, _REVIEWS)
    tasks, restored = folded[_TASKS], folded[_RESTORED]
    reviewing = {t.subject for t in tasks.values()
                 if t.task_class == REVIEW_DERIVED and t.status in ("pending", "running")}
    counts = assess(found, now=run.cycle_start, beliefs=folded[_BELIEFS], sleep=tasks,
                    watches=folded[_WATCHES], reviewing=reviewing, kept=restored,
                    skills=await skill_health(run.store))
    flagged = flagged_count(found, folded[_REVIEWS])
    return msgspec.structs.replace(counts, imports_flagged=flagged)


async def assessment(run: CycleRun) -> None:
    """1. Read-only counts first: nothing is written, no strength or counter is touched."""
    run.assessment = await _assess(run)


async def final_assessment(run: CycleRun) -> Assessment:
    """16. The same counts over what the cycle leaves: the report's health signals."""
    return await _assess(run)


# -- 2. pending sleep tasks ------------------------------------------------------------------


async def _review_derived(run: CycleRun, task: SleepTask) -> Any:
    state = await run.reader.current()
    element = state.elements.get(task.subject)
    if element is None:
        return {"decision": "dropped", "element": task.subject,
                "why": "the derived element is gone (forgotten or purged)"}
    return {"decision": "kept", "element": element.id, "stale_roots": list(element.stale_roots),
            "why": "stale is a review flag: the item stays until it is re-derived or a "
                   "human retracts it"}


async def _watch_review(run: CycleRun, task: SleepTask) -> Any:
    """Surface a fire for the agent: the task is done, the decision (act, ask, defer,
    silence) stays the agent's; maintenance never writes watch-decided."""
    watch = await read_watch(run.store, task.subject)
    if watch is None or watch.fired_op != task.id or watch.decision is not None:
        now = "gone" if watch is None else (
            f"decided: {watch.decision}" if watch.decision else "fired again since")
        return {"decision": None, "watch": task.subject, "why": f"the fire is {now}"}
    return {"decision": "surfaced", "watch": task.subject, "fire": watch.fired_op,
            "why": "maintenance surfaces the fire; deciding it is the agent's (a fired "
                   "watch authorizes nothing)"}


HANDLERS = {REVIEW_DERIVED: _review_derived, WATCH_REVIEW: _watch_review}
assert HANDLERS.keys() == HANDLED  # the rule's triggers count what these handle


async def sleep_tasks(run: CycleRun) -> None:
    """2. Pending sleep tasks assigned to maintenance, or unassigned of a class it handles,
    highest priority then oldest: each claimed with its expected version (a conflict: another
    worker has it, move on), then completed with an outcome or failed with the reason (and
    kept visible). An assignment is a label: the grants decide what maintenance may do."""
    if not await run.allowed("maintain", "process sleep tasks"):
        return
    board = SleepBoard(run.store, ORIGIN, clock=run.clock, cause=run.cause)
    lease_ms = int(run.settings.timeout_s * 1000)
    now = run.now
    tasks = await run.fold(SleepTasks())
    queue = [t for t in claimable(tasks, now) if claims(t, now)]
    for index, task in enumerate(queue):
        if not run.budget.allows(writes=4, transactions=3) or not run.budget.review(1):
            run.deferred.append(f"sleep tasks: {len(queue) - index} left for the next cycle "
                                "(budget)")
            return
        if index and not await run.allowed("maintain", "process sleep tasks"):
            return  # the grant was revoked meanwhile: current governance applies
        claimed = await board.claim(task.id, run.cycle, lease_ms)
        if claimed is None:
            continue  # another worker holds it
        run.budget.spend(writes=1, transactions=1)
        handler = HANDLERS.get(task.task_class)
        try:
            if handler is None:
                raise LookupError(f"maintenance has no handler for task class "
                                  f"{task.task_class!r}")
            outcome = await handler(run, claimed)
        except (StoreError, NotAuthorized):
            raise  # not the task's fault: its lease runs out and it is claimable again
        except Exception as exc:
            await board.fail(task.id, run.cycle, f"{type(exc).__name__}: {exc}")
        else:
            await board.complete(task.id, run.cycle, outcome)
        run.budget.spend(writes=1, transactions=1)


# -- 3/4. consolidation and skill verdicts ---------------------------------------------------


async def consolidation(run: CycleRun) -> None:
    """3. Semantic consolidation, when a proposer is configured: the identities with the
    most unconsolidated sources first, at most `consolidation.max_identities`."""
    if run.proposer is None:
        return
    if not await run.allowed("maintain", "record consolidated insights"):
        return
    state = await run.reader.current()
    cutoff = run.now - CONSOLIDATION_MIN_AGE_MS
    waiting: dict[str, int] = defaultdict(int)
    for e in state.elements.values():
        if e.type in ("exchange", "observation") and e.stage == "active" \
                and not e.consolidated_to and e.created_at < cutoff:
            waiting[e.identity] += 1
    order = sorted(waiting, key=lambda i: (-waiting[i], i))
    limit = run.settings.consolidation.max_identities
    for index, identity in enumerate(order[:limit]):
        if not run.budget.allows(writes=12, transactions=4) or not run.budget.review(
                min(waiting[identity], 20)):
            run.deferred.append(f"consolidation: {len(order) - index} identities left "
                                "(budget)")
            return
        if index and not await run.allowed("maintain", "record consolidated insights"):
            return  # the grant was revoked meanwhile: current governance applies
        report = await consolidate(run.store, run.reader, run.proposer, identity=identity,
                                   now=run.now, origin=ORIGIN, cause=run.cause)
        run.budget.spend(writes=3 * report.accepted, transactions=report.accepted)
        if report.error:
            run.warnings.append(f"consolidation of {identity}: {report.error}")
        if report.deferred:
            run.deferred.append(f"consolidation of {identity}: {report.deferred} insights "
                                "after version conflicts")
    if len(order) > limit:
        run.deferred.append(f"consolidation: {len(order) - limit} identities left "
                            "(max_identities)")


async def skill_verdicts(run: CycleRun) -> None:
    """4. Procedural review: the deterministic lifecycle verdict over each skill's graded
    outcomes (a verdict moves a skill only when the rule says so)."""
    if not await run.allowed("maintain", "record skill verdicts"):
        return
    skills = sorted({e.key.removeprefix("skill:") for e in
                     await run.store.read(kinds=["skill-proposed"])})
    board = SkillBoard(run.store, ORIGIN)
    for index, skill in enumerate(skills):
        if not run.budget.allows(writes=2, transactions=1) or not run.budget.review(1):
            run.deferred.append(f"skill verdicts: {len(skills) - index} skills left (budget)")
            return
        moved = await board.decide(skill, cause=run.cause)
        run.changes["skills_reviewed"] += 1
        if moved is not None:
            run.budget.spend(writes=2, transactions=1)


# -- 5. metabolism ---------------------------------------------------------------------------


def _elements_within(state: ElementsState, run: CycleRun, policy: DecayPolicy) -> int:
    """How many elements of the sweep's queue fit the budget: each batch is one append of
    one event per identity in it, `policy.limit` elements, the last one cut where the
    budget ends. When every element would fit, so does the sweep (it stops where its queue
    ends); the exact plan (the sweep's own order) is made only when the budget could run
    out before the work does."""
    budget = run.budget
    count = len(state.elements)  # at least as many as decay
    if count <= min(budget.elements_left, budget.writes_left) and \
            math.ceil(count / policy.limit) <= budget.transactions_left:
        return count
    queue = eligible_for_decay(state, cycle_start=run.cycle_start, floor=policy.floor,
                               protection=policy.protection)
    taken = writes = 0
    for batch, start in enumerate(range(0, len(queue), policy.limit)):
        if batch >= budget.transactions_left:
            break
        identities: set[str] = set()
        for e in queue[start:start + policy.limit]:
            events = len(identities) + (e.identity not in identities)
            if taken >= budget.elements_left or writes + events > budget.writes_left:
                return taken
            identities.add(e.identity)
            taken += 1
        writes += len(identities)
    return taken


async def metabolism(run: CycleRun) -> None:
    """5. Decay memory strength in bounded batches under this cycle's `cycle_start` (a rerun
    of the cycle never decays an element twice). Left to an earlier cycle that overlaps this
    one (two cycles at once still decay once), and to a later cycle when the last sweep
    (read from the log: any cycle that swept counts, however it ended) was less than
    `decay.min_interval_h` ago. The grant is checked again before every batch: a revoked
    grant stops the sweep there."""
    if not await run.allowed("maintain", "decay memory strength"):
        return
    swept = await last_swept(run.store)
    if swept is not None and (run.swept_at is None or swept > run.swept_at):
        run.swept_at = swept
    interval_ms = int(run.settings.decay.min_interval_h * 3_600_000)
    if run.swept_at is not None and run.swept_at != run.cycle_start \
            and run.cycle_start - run.swept_at < interval_ms:
        hours = (run.cycle_start - run.swept_at) / 3_600_000
        run.deferred.append(f"metabolism: the last sweep was {hours:.1f} h ago (decay "
                            f"min_interval_h {run.settings.decay.min_interval_h:g})")
        return
    earlier = await overlapping_cycles(run.store, run.began_seq,
                                       since_ms=run.abandoned_before)
    if earlier:
        run.deferred.append(f"metabolism: cycle {earlier[0].id} overlaps this one and sweeps "
                            "this time (one decay per cycle)")
        return
    decay = run.settings.decay
    policy = DecayPolicy(factor=decay.factor, floor=decay.floor, protection=decay.protection,
                         limit=decay.limit)
    state = await run.reader.current()
    within = _elements_within(state, run, policy)
    if within == 0:
        if any(decays(e, run.cycle_start, policy.floor, policy.protection)
               for e in state.elements.values()):
            run.deferred.append("metabolism: no budget left for a batch")
        return
    before = run.reader.cursor  # the log's end as `state` was read: before any sweep event

    async def authorize() -> dict[str, int]:
        version = await run.authority.check(PRINCIPAL, "maintain", "decay memory strength")
        return {authority_key(PRINCIPAL): version}

    try:
        report: SweepReport | None = await sweep(
            run.store, run.reader, cycle_start=run.cycle_start, policy=policy,
            origin=ORIGIN, max_elements=within, authorize=authorize,
            appended=run.work.take, cause=run.cause)
    except NotAuthorized as exc:  # revoked mid-sweep: what was written stays, counted below
        report = None
        run.needed_authority.append(f"metabolism: stopped mid-sweep: {exc}")
    if report is None:  # stopped: what it wrote is read back, at most one append an event
        written = [e for e in await run.store.read(before, kinds=["memory-metabolized"])
                   if e.origin == ORIGIN and e.cause == run.cause and isinstance(e.data, dict)]
        if written:
            run.swept_at = run.cycle_start
        run.budget.spend(writes=len(written), transactions=len(written))
        run.budget.review(sum(len(e.data.get("strengths") or ()) for e in written))
        return
    if report.events:
        run.swept_at = run.cycle_start
    run.budget.spend(writes=report.events, transactions=report.writes)
    run.budget.review(report.decayed)
    if not report.complete:
        run.deferred.append("metabolism: elements left undecayed for the next cycle (budget)")
    if report.deferred:
        run.deferred.append(f"metabolism: {len(report.deferred)} elements after version "
                            "conflicts")


STEPS: Sequence[tuple[str, Step]] = (
    ("sleep_tasks", sleep_tasks),
    ("consolidation", consolidation),
    ("skill_verdicts", skill_verdicts),
    ("metabolism", metabolism),
    ("contradictions", contradictions),
    ("derivations", derivations),
    ("commitments", commitments),
    ("watches", watches),
    ("self_model", self_model),
    ("working_state", working_state),
    ("imported_review", imported_review),
    ("retention", retention),
)
"""The cycle's steps after assessment, in the seed's order (those pulse has)."""
