"""One maintenance cycle over a real home: every step, its report, its health signals, its
budgets, its authority, and what a crash, a rerun or a failing step leaves behind."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import msgspec
import pytest

from pulse_adapters.maintenance import (
    NOTHING_TO_DO,
    Budgets,
    CycleReport,
    DecaySettings,
    MaintenanceSettings,
    SkillBoard,
    SkillProposed,
    run_cycle,
)
from pulse_adapters.maintenance._context import CYCLES_PAGE, CycleRun, cycles_began
from pulse_adapters.maintenance._ledger import CYCLES_KEY, CycleBegan
from pulse_adapters.maintenance._settings import ORIGIN
from pulse_core import EventDraft, ManualClock, MemoryBoard
from pulse_core._errors import StoreUnavailable
from pulse_core.maintenance import Authority, ElementsReader, ElementsState, Watches
from pulse_core.maintenance._activities import read_activity
from pulse_core.maintenance._beliefs import BeliefBoard
from pulse_core.maintenance._sleep import SleepBoard, SleepTasks
from pulse_core.maintenance._watches import (
    WatchArmed,
    WatchCondition,
    arm_watch,
    decide_watch,
    read_watch,
)
from pulse_core.memory import Memory, identity_key
from pulse_core.store._base import EventStore
from tests.maintenance.conftest import OpenStore

DAY = 86_400_000
HOUR = 3_600_000


def draft(identity: str, kind: str, **data: Any) -> EventDraft:
    return EventDraft(kind, identity_key(identity), data, origin="agent")


async def elements(store: EventStore) -> ElementsState:
    return await ElementsReader(store).current()


async def build_home(store: EventStore, clock: ManualClock) -> dict[str, str]:
    """A home with something for every step: old exchanges (one consolidated and at the
    floor), an overdue commitment, a contested belief slot, an insight whose root is then
    revised, a review task, a delta watch that a change matches and a silence watch that
    passes its due time. Returns the ids the tests look at."""
    board = MemoryBoard(store)
    await board.register("ana", "Ana")
    old = [(await board.exchange("ana", f"old talk {i}")).data["record"] for i in range(3)]
    await board.set_state("ana", "city", "Lisbon", confidence=0.6)
    clock.advance(40 * DAY)
    insight = "i-city"
    await store.append([
        draft("ana", "insight-recorded", record=insight, text="Ana lives in Lisbon",
              derived_from=["city", old[1]], activity="seed"),
        draft("ana", "element-consolidated", records=[old[0], old[1]], to=f"ana/{insight}"),
        draft("ana", "memory-reinforced", record=old[0], strength=0.05),
        draft("ana", "commitment-made", record="c-call", text="call Ana back",
              due_at=clock.now_ms() - HOUR),
    ])
    await BeliefBoard(store, "agent").assert_("ana", "mood", "calm")
    await BeliefBoard(store, "human:ana").assert_("ana", "mood", "tense")
    task = await SleepBoard(store, "agent").create("review_derived", subject=f"ana/{insight}",
                                                   assigned_to="maintenance")
    await arm_watch(store, "w-delta", WatchArmed(watch_class="delta", condition=WatchCondition(
        key_prefix="identity:ana", kinds=("human-exchange",))), origin="agent")
    await arm_watch(store, "w-silence", WatchArmed(watch_class="silence", condition=WatchCondition(
        key_prefix="identity:bob"), due_at=clock.now_ms() + HOUR), origin="agent")
    await board.exchange("ana", "I moved to Porto")
    await board.set_state("ana", "city", "Porto", confidence=0.9)  # the insight's root revised
    clock.advance(2 * HOUR)
    return {"archived": f"ana/{old[0]}", "insight": f"ana/{insight}", "task": task.id,
            "commitment": "ana/c-call"}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def test_a_full_cycle_runs_every_step_and_reports_what_it_did(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    ids = await build_home(store, clock)
    report = await run_cycle(store, clock=clock, cycle="c1")
    after = await elements(store)

    assert report.status == "completed" and report.warnings == ()
    assert report.steps == ("assessment", "sleep_tasks", "consolidation", "skill_verdicts",
                            "metabolism", "contradictions", "derivations", "commitments",
                            "watches", "self_model", "working_state", "imported_review",
                            "retention")
    assert report.assessment.overdue_commitments == 1 and report.assessment.contested_slots == 1
    assert report.changes["sleep_tasks_completed"] == 1
    assert report.changes["decayed"] == sum(
        1 for e in after.elements.values() if e.last_metabolized_at == report.cycle_start)
    assert report.changes["stale_flagged"] == 1 and after.elements[ids["insight"]].stale
    assert report.changes["watches_fired"] == 2  # the delta matched, the silence passed due
    assert report.changes["archived"] == 1 and after.elements[ids["archived"]].stage == \
        "archived"
    assert report.overdue == (ids["commitment"],) and report.changes["overdue_surfaced"] == 1
    commitment = after.elements[ids["commitment"]].commitment
    assert commitment is not None and commitment.status == "pending"  # never expired
    assert report.contested == ("ana/mood",)
    assert report.outcome != NOTHING_TO_DO
    activity = await read_activity(store, "c1")
    assert activity is not None and activity.status == "completed"
    assert activity.activity_class == "maintenance_cycle"
    assert msgspec.convert(activity.report, CycleReport) == report
    memory = await _memory(store)
    assert memory["ana"].state["city"].confidence == 0.9  # decay never touches confidence
    await store.close()


async def _memory(store: EventStore) -> Any:
    projection = Memory()
    state = projection.initial()
    for event in await store.read(kinds=projection.kinds):
        state = projection.apply(state, event)
    return state


async def test_the_next_cycle_reviews_what_the_last_one_fired_and_flagged(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    ids = await build_home(store, clock)
    first = await run_cycle(store, clock=clock)
    clock.advance(DAY)
    second = await run_cycle(store, clock=clock)
    # two watch reviews (surfaced, left for the agent to decide) and the review_derived task
    # the first one created
    assert second.changes["sleep_tasks_completed"] == 3
    assert "watches_fired" not in second.changes and "stale_flagged" not in second.changes
    assert second.consumed_through > first.consumed_through
    for watch_id in ("w-delta", "w-silence"):
        watch = await read_watch(store, watch_id)
        assert watch is not None and watch.status == "fired" and watch.decision is None
    outcomes = [e.data["outcome"] for e in await store.read(kinds=["sleep-task-completed"])]
    assert sorted(o["watch"] for o in outcomes if o.get("decision") == "surfaced") == [
        "w-delta", "w-silence"]
    assert await store.read(kinds=["watch-decided"]) == []
    fired = await store.read(kinds=["watch-fired"])
    assert Counter(e.key for e in fired) == {"watch:w-delta": 1, "watch:w-silence": 1}
    assert "overdue_surfaced" not in second.changes and second.overdue == (ids["commitment"],)
    assert second.signal("overdue_commitments").value == 1
    assert not second.signal("overdue_commitments").healthy
    assert second.signal("pending_sleep_tasks").value == 0
    await store.close()


async def test_the_report_carries_the_health_signals_of_the_memory_it_leaves(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    board = MemoryBoard(store)
    for i in range(31):
        await board.exchange("bob", f"hello {i}")
    sleep = SleepBoard(store, "agent")
    for i in range(10):
        await sleep.create("consolidate_later", subject=f"bob/{i}")  # for another worker
    clock.advance(8 * DAY)
    report = await run_cycle(store, clock=clock)
    values = {s.name: (s.value, s.healthy) for s in report.health}
    assert values["pending_sleep_tasks"] == (10, False)
    assert values["unconsolidated_events_older_than_7d"] == (31, False)
    assert values["overdue_commitments"] == (0, True)
    assert values["armed_watches_past_due"] == (0, True)
    assert values["contested_slots"] == (0, True)
    assert not report.healthy
    await store.close()


async def test_an_empty_home_completes_with_nothing_safe_to_do(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    report = await run_cycle(store, clock=clock)
    assert (report.status, report.outcome, report.changes) == ("completed", NOTHING_TO_DO, {})
    assert report.healthy
    await store.close()


class HeldAfterFirstBatch(Authority):
    """The standing grants, but the check before the second decay batch waits for ever: the
    cycle is cut after its first batch whatever the backend's speed."""

    def __init__(self, store: EventStore, settings: MaintenanceSettings) -> None:
        super().__init__(store, {"maintenance": settings.grants})
        self.checks = 0

    async def check(self, principal: str, permission: str, action: str) -> int:
        if permission == "maintain" and action == "decay memory strength":
            self.checks += 1
            if self.checks == 2:
                await asyncio.Event().wait()
        return await super().check(principal, permission, action)


async def _cancel_after_first_batch(store: EventStore, cycle: asyncio.Task[CycleReport],
                                    since: int) -> None:
    async for event in store.changes(since, kinds=["memory-metabolized"]):
        del event
        cycle.cancel()
        return


async def test_a_cycle_cancelled_after_its_first_sweep_batch_then_rerun_decays_nothing_twice(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    await store.append([draft(f"p{i % 7}", "human-exchange", record=f"x-{i}", text="hi")
                        for i in range(60)])
    settings = MaintenanceSettings(decay=DecaySettings(limit=10))
    since = await store.last_seq()  # before the cycle: its first batch is never missed
    cycle = asyncio.ensure_future(run_cycle(store, settings, clock=clock, cycle="crashy",
                                            authority=HeldAfterFirstBatch(store, settings)))
    watcher = asyncio.ensure_future(_cancel_after_first_batch(store, cycle, since))
    with pytest.raises(asyncio.CancelledError):
        await cycle
    await watcher
    halfway = await elements(store)
    stamped = [e for e in halfway.elements.values() if e.last_metabolized_at is not None]
    assert 0 < len(stamped) < 60  # the sweep was cut short
    running = await read_activity(store, "crashy")
    assert running is not None and running.status == "running"
    clock.advance(HOUR)  # the retry comes later: the cycle_start is the one bound at first
    report = await run_cycle(store, settings, clock=clock, cycle="crashy")
    after = await elements(store)
    assert report.cycle_start == running.started_at
    assert {e.strength for e in after.elements.values()} == {0.97}
    per_record: Counter[str] = Counter()
    for event in await store.read(kinds=["memory-metabolized"]):
        per_record.update(list(event.data["strengths"]))
    assert len(per_record) == 60 and set(per_record.values()) == {1}
    await store.close()


async def test_an_ended_cycle_run_again_returns_its_report_and_writes_nothing(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    await MemoryBoard(store).exchange("ana", "hi")
    first = await run_cycle(store, clock=clock, cycle="once")
    head = await store.last_seq()
    clock.advance(DAY)
    again = await run_cycle(store, clock=clock, cycle="once")
    assert again == first and await store.last_seq() == head
    await store.close()


async def test_a_step_that_raises_is_a_warning_and_the_cycle_goes_on(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    await MemoryBoard(store).exchange("ana", "hi")
    from pulse_adapters.maintenance._steps import metabolism

    async def broken(run: CycleRun) -> None:
        raise ValueError("a bug in a step")

    report = await run_cycle(store, clock=clock,
                             steps=[("broken", broken), ("metabolism", metabolism)])
    assert report.status == "completed"
    assert report.warnings == ("broken: ValueError: a bug in a step",)
    assert report.changes == {"decayed": 1} and report.steps[-1] == "metabolism"
    await store.close()


async def test_a_failing_store_ends_the_cycle_failed_with_the_reason(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)

    async def disk_full(run: CycleRun) -> None:
        raise StoreUnavailable("database or disk is full")

    report = await run_cycle(store, clock=clock, cycle="doomed", steps=[("write", disk_full)])
    activity = await read_activity(store, "doomed")
    assert report.status == "failed" and activity is not None and activity.status == "failed"
    assert "disk is full" in activity.reason
    await store.close()


async def test_folds_caught_up_together_or_alone_hold_every_append_since_the_last_call(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    """A cycle's folds share one read of the log when caught up together; each call, together
    or alone, still reads the log as it is then."""
    store = await open_store(clock)
    board = SleepBoard(store, "agent", clock=clock)
    seen: list[tuple[int, int, int, int]] = []

    async def probe(run: CycleRun) -> None:
        tasks, watching = SleepTasks(), Watches()
        before = await run.folds(tasks, watching)
        await board.create("custom", task_id="t-1")
        alone = await run.fold(tasks)
        await board.create("custom", task_id="t-2")
        together = await run.folds(watching, tasks)
        seen.append((len(before[tasks]), len(alone), len(together[tasks]),
                     len(together[watching])))

    report = await run_cycle(store, clock=clock, steps=[("probe", probe)])
    assert report.warnings == ()
    assert seen == [(0, 1, 2, 0)]
    await store.close()


async def test_the_cycles_began_are_walked_newest_first_each_once_past_the_first_read(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    """The cycles maintenance began are read a few of the newest at a time: the walk goes
    past the first read in order, every cycle once; one written by another origin is no
    cycle, and one that begins during the walk is not in it."""
    store = await open_store(clock)

    def began(n: int, origin: str = ORIGIN) -> EventDraft:
        body = CycleBegan(cycle=f"c-{n}", cycle_start=1_000 + n, trigger="test", through_seq=0)
        return EventDraft("maintenance-cycle-began", CYCLES_KEY, msgspec.to_builtins(body),
                          origin=origin)

    count = 3 * CYCLES_PAGE
    await store.append([began(n) for n in range(count)] + [began(count, origin="agent")])
    walked: list[str] = []
    async for _, cycle in cycles_began(store):
        walked.append(cycle.cycle)
        if len(walked) == 1:
            await store.append([began(100)])  # begins during the walk
    assert walked == [f"c-{n}" for n in reversed(range(count))]
    recent = [c.cycle async for _, c in cycles_began(store, since_ms=1_000 + 2 * CYCLES_PAGE)]
    assert recent == ["c-100", *(f"c-{n}" for n in reversed(range(2 * CYCLES_PAGE, count)))]
    await store.close()


async def test_budgets_bound_a_cycle_and_the_next_one_does_the_rest(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    await store.append([draft(f"p{i}", "human-exchange", record=f"x-{i}", text="hi")
                        for i in range(30)])
    settings = MaintenanceSettings(budgets=Budgets(max_writes=12, max_transactions=5),
                                   decay=DecaySettings(limit=10))
    first = await run_cycle(store, settings, clock=clock)
    assert first.writes <= 12 and first.transactions <= 5
    # a batch of 10 identities, then the next one cut where the 12 writes end
    assert first.changes["decayed"] == 12
    assert any(d.startswith("metabolism:") for d in first.deferred)
    clock.advance(DAY)
    await run_cycle(store, settings, clock=clock)
    clock.advance(DAY)
    await run_cycle(store, settings, clock=clock)
    state = await elements(store)
    assert all(e.last_metabolized_at is not None for e in state.elements.values())
    await store.close()


async def test_what_needs_a_grant_maintenance_lacks_is_reported_not_done(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    ids = await build_home(store, clock)
    settings = MaintenanceSettings(grants=("read", "search", "maintain"))
    report = await run_cycle(store, settings, clock=clock)
    state = await elements(store)
    assert state.elements[ids["archived"]].stage == "active"
    assert "archived" not in report.changes
    assert report.needed_authority == (
        "archive 1 consolidated exchanges at the floor (needs 'archive')",)
    await store.close()


async def test_cycles_closer_than_the_decay_interval_decay_once(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    await MemoryBoard(store).exchange("ana", "hi")
    first = await run_cycle(store, clock=clock)
    clock.advance(HOUR)  # an on-demand cycle soon after: everything but the sweep
    soon = await run_cycle(store, clock=clock)
    clock.advance(12 * HOUR)
    later = await run_cycle(store, clock=clock)
    assert (first.changes, soon.changes, later.changes) == (
        {"decayed": 1}, {}, {"decayed": 1})
    assert soon.deferred == ("metabolism: the last sweep was 1.0 h ago (decay "
                             "min_interval_h 12)",)
    assert (soon.swept_at, later.swept_at) == (first.cycle_start, later.cycle_start)
    state = await elements(store)
    assert {e.strength for e in state.elements.values()} == {round(0.97 * 0.97, 6)}
    await store.close()


async def test_a_configured_proposer_consolidates_once_and_the_next_cycle_moves_on(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    board = MemoryBoard(store)
    said = [(await board.exchange("ana", text)).data["record"]
            for text in ("I run every morning", "ran 10k today", "new running shoes")]
    clock.advance(2 * HOUR)
    shown: list[list[str]] = []

    async def proposer(batch: Any) -> list[Any]:
        shown.append([item.id for item in batch.sources])
        ids = [item.id for item in batch.sources]
        return [{"text": "Ana runs a lot", "inputs": ids[:2], "salience": 0.6}] if ids else []

    first = await run_cycle(store, clock=clock, proposer=proposer)
    clock.advance(DAY)
    second = await run_cycle(store, clock=clock, proposer=proposer)
    assert first.changes["semantic_consolidations"] == 1
    assert shown[0] == [f"ana/{r}" for r in said]
    assert "semantic_consolidations" not in second.changes  # one source left: below 2 roots
    state = await elements(store)
    (insight,) = [e for e in state.elements.values() if e.type == "insight"]
    assert insight.derived_from == tuple(f"ana/{r}" for r in said[:2])
    assert all(insight.id in state.elements[f"ana/{r}"].consolidated_to for r in said[:2])
    await store.close()


async def test_a_stale_flag_without_a_review_task_gets_one(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    await MemoryBoard(store).set_state("ana", "city", "Lisbon")
    await store.append([
        draft("ana", "insight-recorded", record="i-1", text="Lisbon", derived_from=["city"],
              activity="seed"),
        draft("ana", "derivation-stale", record="i-1", root="ana/city", reason="corrected"),
    ])  # flagged by a correction (or by a cycle cut short before its task)
    report = await run_cycle(store, clock=clock)
    assert report.changes["review_tasks_created"] == 1
    (task,) = await store.read(kinds=["sleep-task-created"])
    assert (task.key, task.data["subject"]) == ("sleep:review_derived:ana/i-1:ana/city",
                                                "ana/i-1")
    clock.advance(DAY)
    again = await run_cycle(store, clock=clock)
    assert "review_tasks_created" not in again.changes
    assert again.changes["sleep_tasks_completed"] == 1
    assert (await elements(store)).elements["ana/i-1"].stale  # a review never retracts
    await store.close()


async def test_a_fire_the_agent_already_decided_is_left_as_decided(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    await arm_watch(store, "w", WatchArmed(watch_class="silence", condition=WatchCondition(
        key_prefix="identity:bob"), due_at=clock.now_ms() + HOUR), origin="agent")
    clock.advance(2 * HOUR)
    fired = await run_cycle(store, clock=clock)
    assert fired.changes["watches_fired"] == 1
    await decide_watch(store, "w", "act", "I called Bob", origin="agent")
    clock.advance(DAY)
    after = await run_cycle(store, clock=clock)
    (done,) = await store.read(kinds=["sleep-task-completed"])
    assert done.data["outcome"]["why"] == "the fire is decided: act"
    assert after.changes["sleep_tasks_completed"] == 1
    watch = await read_watch(store, "w")
    assert watch is not None and watch.decision == "act"
    await store.close()


async def test_skills_get_their_deterministic_verdict_each_cycle(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    await SkillBoard(store, "agent").propose("brew", SkillProposed(
        name="brew coffee", task_family="coffee", procedure="grind, pour"))
    report = await run_cycle(store, clock=clock)
    skill = await SkillBoard(store).read("brew")
    assert report.changes["skills_reviewed"] == report.changes["skill_verdicts"] == 1
    assert skill is not None and (skill.status, skill.verdicts) == ("trialed", 1)
    await store.close()


async def test_a_cycle_abandoned_long_ago_is_ended_cancelled_by_the_next(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    await MemoryBoard(store).exchange("ana", "hi")

    async def crash(run: CycleRun) -> None:
        raise asyncio.CancelledError  # the engine died under it: it stays running

    with pytest.raises(asyncio.CancelledError):
        await run_cycle(store, clock=clock, cycle="lost", steps=[("crash", crash)])
    clock.advance(HOUR)  # within 4 x timeout_s (900 s): a retry may still come
    soon = await run_cycle(store, clock=clock, cycle="soon")
    assert "abandoned_cycles_closed" not in soon.changes
    clock.advance(HOUR)
    later = await run_cycle(store, clock=clock, cycle="later")
    lost = await read_activity(store, "lost")
    assert later.changes["abandoned_cycles_closed"] == 1
    assert lost is not None and lost.status == "cancelled"
    assert lost.reason.startswith("abandoned:") and "later took over" in lost.reason
    await store.close()


async def test_sleep_tasks_for_others_are_left_and_unknown_work_fails_visibly(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    board = SleepBoard(store, "agent")
    theirs = await board.create("review_derived", subject="ana/i-1", assigned_to="agent")
    odd = await board.create("paint_the_fence", assigned_to="maintenance")
    report = await run_cycle(store, clock=clock)
    left, failed = await board.state(theirs.id), await board.state(odd.id)
    assert left is not None and left.status == "pending"
    assert failed is not None and failed.status == "failed"
    assert failed.failure == ("LookupError: maintenance has no handler for task class "
                              "'paint_the_fence'")
    assert report.changes == {"sleep_tasks_failed": 1}
    assert report.signal("failed_sleep_tasks").value == 1
    await store.close()


async def test_an_exchange_somebody_restored_is_not_archived_again(
    open_store: OpenStore, clock: ManualClock,
) -> None:
    store = await open_store(clock)
    ids = await build_home(store, clock)
    first = await run_cycle(store, clock=clock)
    assert first.changes["archived"] == 1
    identity, record = ids["archived"].split("/")
    await store.append([EventDraft("element-restored", identity_key(identity),
                                   {"record": record, "reason": "I still need it"},
                                   origin="human:ana")])
    clock.advance(DAY)
    second = await run_cycle(store, clock=clock)
    assert "archived" not in second.changes
    assert (await elements(store)).elements[ids["archived"]].stage == "active"
    assert second.signal("elements_past_retention").value == 0  # a human reviewed it
    await store.close()
