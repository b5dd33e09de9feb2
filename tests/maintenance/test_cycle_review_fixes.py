"""What a hostile review found in maintenance cycles and its rule, each pinned by a test: decay
intervals across failed and concurrent cycles, revoked grants mid-sweep, the agent's watch
decision, triggers for work maintenance never does, forged ledger events, unbounded settings,
the tick hint clamp, a poisoned stale flag, and the ledger's bounded running list."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from pulse_adapters.maintenance._context import CycleRun, fold
from pulse_adapters.maintenance._cycle import run_cycle
from pulse_adapters.maintenance._ledger import (
    CYCLES_KEY,
    MAX_RUNNING,
    MaintenanceLedger,
)
from pulse_adapters.maintenance._rule import MaintenanceRule
from pulse_adapters.maintenance._settings import (
    ORIGIN,
    Budgets,
    MaintenanceSettings,
    MaintenanceSettingsError,
    load_settings,
)
from pulse_adapters.maintenance._steps import metabolism
from pulse_core import EventDraft, ManualClock
from pulse_core._errors import StoreError
from pulse_core._snapshot import Snapshot
from pulse_core.maintenance import ElementsReader
from pulse_core.maintenance._activities import read_activity
from pulse_core.maintenance._authority import Authority
from pulse_core.maintenance._schedules import Schedules
from pulse_core.maintenance._sleep import SleepBoard, SleepTasks
from pulse_core.maintenance._watches import (
    WatchArmed,
    WatchCondition,
    Watches,
    arm_watch,
    decide_watch,
    read_watch,
)
from pulse_core.memory import identity_key
from pulse_core.store._base import EventStore
from tests.maintenance.conftest import OpenStore

HOUR = 3_600_000


def exchanges(identity: str, n: int, prefix: str = "x") -> list[EventDraft]:
    return [EventDraft("human-exchange", identity_key(identity),
                       {"record": f"{prefix}-{i}", "text": "hi", "role": "human"},
                       origin="human") for i in range(n)]


async def decays_per_element(store: EventStore) -> Counter[tuple[str, str]]:
    found: Counter[tuple[str, str]] = Counter()
    for e in await store.read(kinds=["memory-metabolized"]):
        for record in e.data["strengths"]:
            found[(e.key, record)] += 1
    return found


async def snapshot(store: EventStore, at: int, *, pending: frozenset[str] = frozenset()
                   ) -> Snapshot:
    projections = {p.name: await fold(store, p) for p in
                   (MaintenanceLedger(), Schedules(), SleepTasks(), Watches())}
    return Snapshot(seq=await store.last_seq(), at=at, number=1, vitals={},
                    projections=projections, pending_effects=pending)


# -- 4. decay's min_interval_h holds whatever way the sweeping cycle ended ---------------------


async def _boom(run: CycleRun) -> None:
    raise StoreError("disk full")


async def test_cycle_a_cycle_that_swept_then_failed_still_counts_for_the_decay_interval(
    open_store: OpenStore,
) -> None:
    clock = ManualClock(1_700_000_000_000)
    store = await open_store(clock)
    await store.append(exchanges("ana", 3))
    await run_cycle(store, cycle="c0", clock=clock)
    clock.advance(13 * HOUR)
    failed = await run_cycle(store, cycle="c1", clock=clock,
                             steps=[("metabolism", metabolism), ("boom", _boom)])
    assert failed.status == "failed" and failed.changes["decayed"] == 3
    clock.advance(60_000)
    after = await run_cycle(store, cycle="c2", clock=clock)
    assert after.changes.get("decayed", 0) == 0
    assert after.swept_at == failed.cycle_start
    assert set((await decays_per_element(store)).values()) == {2}
    await store.close()


async def test_cycle_concurrent_cycles_in_two_stores_decay_each_element_once_per_interval(
    open_store: OpenStore,
) -> None:
    clock = ManualClock(1_700_000_000_000)
    one = await open_store(clock)
    two = await open_store(clock)
    await one.append([d for i in range(5) for d in exchanges(f"p{i}", 20, f"x{i}")])
    settings = MaintenanceSettings(budgets=Budgets(max_transactions=1000, max_writes=100_000))
    await asyncio.gather(run_cycle(one, settings, cycle="a", clock=clock),
                         run_cycle(two, settings, cycle="b", clock=clock))
    clock.advance(1000)
    await asyncio.gather(run_cycle(one, settings, cycle="c", clock=clock),
                         run_cycle(two, settings, cycle="d", clock=clock))
    counts = await decays_per_element(one)
    assert len(counts) == 100 and set(counts.values()) == {1}
    await one.close()
    await two.close()


# -- 5. a grant revoked mid-sweep stops the sweep --------------------------------------------


async def test_cycle_a_grant_revoked_during_a_sweep_stops_it_at_the_next_batch(
    open_store: OpenStore,
) -> None:
    clock = ManualClock(1_700_000_000_000)
    store = await open_store(clock)
    await store.append([d for i in range(10) for d in exchanges(f"p{i}", 1)])
    settings = load_settings({"decay": {"limit": 1}})
    authority = Authority(store, {})
    await authority.issue("maintenance", "maintain", origin="human")
    original = store.append
    metabolized = 0

    async def append(drafts: Any, expect: Any = None) -> Any:
        nonlocal metabolized
        result = await original(drafts, expect)
        if any(d.kind == "memory-metabolized" for d in drafts):
            metabolized += 1
            if metabolized == 2:  # a human revokes the grant while the sweep runs
                await authority.revoke("maintenance", "maintain", origin="human")
        return result

    store.append = append  # type: ignore[method-assign]
    report = await run_cycle(store, settings, cycle="c", clock=clock, authority=authority,
                             steps=[("metabolism", metabolism)])
    store.append = original  # type: ignore[method-assign]
    assert len(await decays_per_element(store)) == 2
    assert report.changes.get("decayed") == 2
    assert any("metabolism" in note for note in report.needed_authority)
    await store.close()


async def test_cycle_a_grant_revoked_during_the_sleep_task_loop_stops_it_at_the_next_task(
    open_store: OpenStore,
) -> None:
    clock = ManualClock(1_700_000_000_000)
    store = await open_store(clock)
    board = SleepBoard(store, "agent", clock=clock)
    for i in range(4):
        await board.create("review_derived", subject=f"ana/x-{i}", assigned_to="maintenance")
    authority = Authority(store, {})
    await authority.issue("maintenance", "maintain", origin="human")
    original = store.append

    async def append(drafts: Any, expect: Any = None) -> Any:
        result = await original(drafts, expect)
        if any(d.kind == "sleep-task-completed" for d in drafts):
            await authority.revoke("maintenance", "maintain", origin="human")
        return result

    store.append = append  # type: ignore[method-assign]
    from pulse_adapters.maintenance._steps import sleep_tasks
    report = await run_cycle(store, cycle="c", clock=clock, authority=authority,
                             steps=[("sleep_tasks", sleep_tasks)])
    store.append = original  # type: ignore[method-assign]
    assert len(await store.read(kinds=["sleep-task-claimed"])) == 1
    assert report.changes.get("sleep_tasks_completed") == 1
    assert report.needed_authority
    await store.close()


# -- 6. maintenance never takes the agent's decision on a fired watch ---------------------------


async def test_cycle_a_fired_watch_is_surfaced_and_the_agent_still_decides_it(
    open_store: OpenStore,
) -> None:
    clock = ManualClock(1_700_000_000_000)
    store = await open_store(clock)
    await arm_watch(store, "deploy", WatchArmed(watch_class="delta", condition=WatchCondition(
        key_prefix="identity:ana")), origin="agent")
    await store.append(exchanges("ana", 1))
    await run_cycle(store, cycle="c1", clock=clock)
    clock.advance(700_000)
    second = await run_cycle(store, cycle="c2", clock=clock)
    assert second.changes.get("sleep_tasks_completed") == 1
    (done,) = await store.read(kinds=["sleep-task-completed"])
    assert done.data["outcome"]["decision"] == "surfaced"
    assert await store.read(kinds=["watch-decided"]) == []
    decided = await decide_watch(store, "deploy", "act", "page the on-call", origin="agent")
    assert decided.ran
    watch = await read_watch(store, "deploy")
    assert watch is not None and watch.decision == "act"
    await store.close()


# -- 7. triggers count only work maintenance would claim ---------------------------------------


async def test_cycle_tasks_maintenance_never_claims_start_no_backlog_or_watch_cycle(
    open_store: OpenStore,
) -> None:
    clock = ManualClock(1_700_000_000_000)
    store = await open_store(clock)
    board = SleepBoard(store, "agent", clock=clock)
    for i in range(12):
        await board.create("summarize", subject=f"ana/x-{i}")  # unassigned, a class it lacks
        await board.create("review_derived", subject=f"ana/y-{i}", assigned_to="agent")
    await board.create("other_class", task_id="watch_fire:w:7", subject="w")
    rule = MaintenanceRule(MaintenanceSettings(schedule=load_settings(
        {"schedule": {"every_h": None}}).schedule))
    cycle, _ = rule.due(await snapshot(store, clock.now_ms()))
    assert cycle is None
    for i in range(10):
        await board.create("review_derived", subject=f"ana/z-{i}", assigned_to="maintenance")
    cycle, _ = rule.due(await snapshot(store, clock.now_ms() + 1))
    assert cycle is not None and cycle.trigger == "backlog"
    await store.close()


# -- 8. a matching change to a delta watch triggers a cycle ------------------------------------


async def test_cycle_a_change_matching_an_armed_delta_watch_triggers_a_watch_cycle(
    open_store: OpenStore,
) -> None:
    clock = ManualClock(1_700_000_000_000)
    store = await open_store(clock)
    await arm_watch(store, "deploy", WatchArmed(watch_class="delta", condition=WatchCondition(
        key_prefix="identity:ana")), origin="agent")
    rule = MaintenanceRule(load_settings({"schedule": {"every_h": None}}))
    await store.append(exchanges("bob", 1))
    assert rule.due(await snapshot(store, clock.now_ms()))[0] is None
    await store.append(exchanges("ana", 1))
    cycle, _ = rule.due(await snapshot(store, clock.now_ms() + 1))
    assert cycle is not None and cycle.trigger == "watch" and "deploy" in cycle.reason
    await store.close()


# -- 9. a forged maintenance-cycle-began stops nothing -----------------------------------------


async def test_cycle_a_forged_cycle_began_neither_counts_nor_postpones_the_schedule(
    open_store: OpenStore,
) -> None:
    clock = ManualClock(1_700_000_000_000)
    store = await open_store(clock)
    await store.append([
        EventDraft("maintenance-cycle-began", "notes:x", {"cycle": "g1", "cycle_start": 2**62},
                   origin="agent"),
        EventDraft("maintenance-cycle-began", CYCLES_KEY, {"cycle": "g2",
                                                           "cycle_start": 2**62},
                   origin="agent")])
    ledger = await fold(store, MaintenanceLedger())
    assert ledger.cycles == 0 and ledger.last_cycle_start is None
    await store.append([EventDraft("maintenance-cycle-began", CYCLES_KEY,
                                   {"cycle": "g3", "cycle_start": 2**62}, origin=ORIGIN)])
    ledger = await fold(store, MaintenanceLedger())
    (began,) = await store.read(kinds=["maintenance-cycle-began"], newest_first=True, limit=1)
    assert ledger.cycles == 1 and ledger.last_cycle_start == began.ts
    await store.close()


async def test_cycle_the_ledger_keeps_a_bounded_list_of_running_cycles(
    open_store: OpenStore,
) -> None:
    store = await open_store()
    await store.append([EventDraft("maintenance-cycle-began", CYCLES_KEY,
                                   {"cycle": f"c{i}", "cycle_start": 1}, origin=ORIGIN)
                        for i in range(MAX_RUNNING + 50)])
    ledger = await fold(store, MaintenanceLedger())
    assert len(ledger.running) == MAX_RUNNING
    assert ledger.running[-1] == f"c{MAX_RUNNING + 49}"
    await store.close()


# -- 10. unbounded settings and silent exceptions ----------------------------------------------


@pytest.mark.parametrize(("config", "field"), [
    ({"triggers": {"min_gap_s": 1e306}}, "triggers.min_gap_s"),
    ({"triggers": {"min_gap_s": float("nan")}}, "triggers.min_gap_s"),
    ({"timeout_s": 1e306}, "timeout_s"),
    ({"timeout_s": float("nan")}, "timeout_s"),
    ({"retention": {"archive_after_days": 1e306}}, "retention.archive_after_days"),
    ({"triggers": {"backlog": 10**12}}, "triggers.backlog"),
    ({"triggers": {"post_session_exchanges": 10**12}}, "triggers.post_session_exchanges"),
    ({"consolidation": {"timeout_s": 1e306}}, "consolidation.timeout_s"),
    ({"consolidation": {"max_wall_s": 1e306}}, "consolidation.max_wall_s"),
])
def test_cycle_settings_past_their_upper_bound_are_refused_naming_the_field(
    config: dict[str, Any], field: str,
) -> None:
    with pytest.raises(MaintenanceSettingsError, match=f"`layers.maintenance.{field}`"):
        load_settings(config)


def test_cycle_the_largest_allowed_settings_load() -> None:
    loaded = load_settings({"triggers": {"min_gap_s": 7 * 86_400}, "timeout_s": 86_400})
    assert (loaded.triggers.min_gap_s, loaded.timeout_s) == (7 * 86_400, 86_400)


async def test_cycle_an_exception_closing_abandoned_cycles_or_assessing_is_a_warning(
    open_store: OpenStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pulse_adapters.maintenance import _cycle

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise OverflowError("date value out of range")

    monkeypatch.setattr(_cycle, "running_before", broken)
    monkeypatch.setattr(_cycle, "final_assessment", broken)
    store = await open_store()
    report = await run_cycle(store, cycle="c")
    activity = await read_activity(store, "c")
    assert activity is not None and activity.status == "completed"
    assert report.status == "completed"
    assert any("OverflowError" in w and "abandoned" in w for w in report.warnings)
    assert any("OverflowError" in w and "final assessment" in w for w in report.warnings)
    await store.close()


# -- 11. the tick hint is never under a second -------------------------------------------------


async def test_cycle_a_silence_watch_due_in_under_a_second_still_gives_a_hint_of_a_second(
    open_store: OpenStore,
) -> None:
    clock = ManualClock(1_700_000_000_000)
    store = await open_store(clock)
    await arm_watch(store, "w", WatchArmed(watch_class="silence", condition=WatchCondition(
        key_prefix="identity:bob"), due_at=clock.now_ms() + 300), origin="agent")
    rule = MaintenanceRule(load_settings({"schedule": {"every_h": None}}))
    curr = await snapshot(store, clock.now_ms(), pending=frozenset({"maintenance-cycle"}))

    async def inner(prev: Snapshot, curr: Snapshot) -> Any:
        return [], 3_600_000

    decision = await rule(curr, curr, inner)
    assert decision.tick_ms == 1_000
    await store.close()


# -- 12. one poisoned stale flag does not stop the others --------------------------------------


async def test_cycle_a_poisoned_stale_flag_is_skipped_with_a_warning_and_the_others_reviewed(
    open_store: OpenStore,
) -> None:
    clock = ManualClock(1_700_000_000_000)
    store = await open_store(clock)
    await store.append(exchanges("ana", 8))
    await store.append([EventDraft("derivation-stale", identity_key("ana"), {
        "record": f"x-{i}", "root": "r" * 512 if i == 0 else "ana/root"}, origin="agent")
        for i in range(8)])
    from pulse_adapters.maintenance._steps import STEPS
    report = await run_cycle(store, cycle="c", clock=clock,
                             steps=[s for s in STEPS if s[0] == "derivations"])
    created = await store.read(kinds=["sleep-task-created"])
    assert sorted(e.key for e in created) == [
        f"sleep:review_derived:ana/x-{i}:ana/root" for i in range(1, 8)]
    assert any("ana/x-0" in w and len(w) < 1_000 for w in report.warnings)
    await store.close()


async def test_cycle_a_grant_revoked_between_the_check_and_the_batch_write_never_lands(
    open_store: OpenStore,
) -> None:
    from pulse_core._errors import NotAuthorized
    from pulse_core.maintenance._authority import authority_key
    from pulse_core.maintenance._metabolism import sweep

    store = await open_store()
    await store.append([d for i in range(3) for d in exchanges(f"p{i}", 2)])
    authority = Authority(store, {})
    await authority.issue("maintenance", "maintain", origin="human")
    checks = 0

    async def authorize() -> dict[str, int]:
        nonlocal checks
        checks += 1
        version = await authority.check("maintenance", "maintain", "decay")
        if checks == 1:  # the revocation lands after the check, before the write
            await authority.revoke("maintenance", "maintain", origin="human")
        return {authority_key("maintenance"): version}

    with pytest.raises(NotAuthorized):
        await sweep(store, ElementsReader(store), cycle_start=1, authorize=authorize)
    assert await store.read(kinds=["memory-metabolized"]) == []
    await store.close()


# -- 13. one cycle folds each projection once and reads only recent cycles ----------------------


async def test_cycle_a_cycle_reads_each_sleep_task_event_once(
    open_store: OpenStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pulse_core.maintenance._sleep import SleepTaskCreated, sleep_task_draft

    clock = ManualClock(1_700_000_000_000)
    store = await open_store(clock)
    await store.append([sleep_task_draft(f"t{i}", SleepTaskCreated(task_class="summarize"),
                                         origin="agent") for i in range(200)])
    read: Counter[int] = Counter()
    original = store.read_page

    async def counted(*args: Any, **kwargs: Any) -> Any:
        page = await original(*args, **kwargs)
        if kwargs.get("kinds") is not None:  # the projection folds (not the elements reader)
            read.update(e.seq for e in page.events if e.kind == "sleep-task-created")
        return page

    monkeypatch.setattr(store, "read_page", counted)
    await run_cycle(store, cycle="c", clock=clock)
    assert len(read) == 200 and set(read.values()) == {1}
    await store.close()


async def test_cycle_a_cycle_reads_only_the_cycles_the_last_one_could_not_close(
    open_store: OpenStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pulse_core.maintenance._activities import read_activity

    clock = ManualClock(1_700_000_000_000)
    store = await open_store(clock)
    start = clock.now_ms() - 30 * 86_400_000
    await store.append([EventDraft("maintenance-cycle-began", CYCLES_KEY, {
        "cycle": f"old{i}", "cycle_start": start + i * 600_000}, origin=ORIGIN)
        for i in range(300)])
    await run_cycle(store, cycle="first", clock=clock)
    clock.advance(13 * HOUR)
    reads = 0
    original = read_activity

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await original(*args, **kwargs)

    monkeypatch.setattr("pulse_adapters.maintenance._context.read_activity", counted)
    monkeypatch.setattr("pulse_adapters.maintenance._cycle.read_activity", counted)
    await run_cycle(store, cycle="second", clock=clock)
    assert reads < 20
    await store.close()


# -- 13. watch evaluation is bounded per cycle and resumes where it stopped --------------------


async def test_cycle_watch_evaluation_reads_a_bounded_share_of_the_log_and_the_next_goes_on(
    open_store: OpenStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pulse_adapters.maintenance._reviews as reviews

    monkeypatch.setattr(reviews, "WATCH_EVENTS", 4)
    clock = ManualClock(1_700_000_000_000)
    store = await open_store(clock)
    await arm_watch(store, "bob", WatchArmed(watch_class="delta", condition=WatchCondition(
        key_prefix="identity:bob")), origin="agent")
    await store.append(exchanges("ana", 12))
    await store.append(exchanges("bob", 1))
    first = await run_cycle(store, cycle="c1", clock=clock)
    assert any("watch evaluation" in d for d in first.deferred)
    assert first.consumed_through < await store.last_seq()
    assert (await read_watch(store, "bob")).status == "armed"  # type: ignore[union-attr]
    cursors = [first.consumed_through]
    for n in range(2, 12):
        clock.advance(700_000)
        report = await run_cycle(store, cycle=f"c{n}", clock=clock)
        cursors.append(report.consumed_through)
        if (await read_watch(store, "bob")).status == "fired":  # type: ignore[union-attr]
            break
    assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)  # always onward
    assert (await read_watch(store, "bob")).status == "fired"  # type: ignore[union-attr]
    assert len(await store.read(kinds=["watch-fired"])) == 1
    await store.close()
