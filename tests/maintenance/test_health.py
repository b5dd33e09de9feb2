"""The report's eleven health signals: each row's value and bound, and the two skill rows read
from a real log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from pulse_adapters.maintenance import Assessment, SkillBoard, run_cycle
from pulse_adapters.maintenance._report import health_signals
from pulse_adapters.maintenance._skill_health import skill_health
from pulse_adapters.maintenance._skills import OutcomeObserved, SkillProposed, VerdictPolicy
from pulse_core import ManualClock
from pulse_core.store import SqliteEventStore
from tests.maintenance.test_skills import FAMILY, applied, baseline, skill_body, trialed

TEST_TIME_LIMIT_S = 20
POLICY = VerdictPolicy(quota=3, margin=0.1, revoke_quota=2)

SIGNALS = {
    # name: (assessment field, the first unhealthy value; None: always healthy)
    "pending_sleep_tasks": ("pending_sleep_tasks", 10),
    "unconsolidated_events_older_than_7d": ("unconsolidated_old", 30),
    "contested_slots": ("contested_slots", None),
    "skills_awaiting_verdict": ("skills_awaiting_verdict", 10),
    "trials_starved_of_outcomes": ("trials_starved", 1),
    "overdue_commitments": ("overdue_commitments", 1),
    "armed_watches_past_due": ("watches_past_due", 1),
    "stale_artifacts": ("stale_unreviewed", 1),
    "quarantined_imports": ("imports_flagged", 1),
    "elements_past_retention": ("retention_backlog", 1),
    "failed_sleep_tasks": ("failed_sleep_tasks", None),
}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    events = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        yield events
    finally:
        await events.close()


def test_the_report_has_eleven_signals_in_the_seeds_order() -> None:
    names = [s.name for s in health_signals(Assessment())]
    assert sorted(names) == sorted(SIGNALS) and len(names) == 11
    assert all(s.healthy for s in health_signals(Assessment()))


@pytest.mark.parametrize("name", sorted(SIGNALS))
def test_each_signal_reads_its_count_and_turns_unhealthy_at_its_bound(name: str) -> None:
    field, bound = SIGNALS[name]
    value = bound if bound is not None else 7
    below = {field: value - 1} if bound is not None else {}
    at = health_signals(Assessment(**{field: value}))
    row = next(s for s in at if s.name == name)
    others = [s for s in at if s.name != name]
    assert all(s.healthy for s in others), "one count moved another signal"
    if name == "stale_artifacts":
        assert row.healthy is False  # stale_unreviewed decides, stale_derived is the value
    else:
        assert row.value == value
        assert row.healthy is (bound is None)
    if below:
        held = next(s for s in health_signals(Assessment(**below)) if s.name == name)
        assert held.healthy


def test_stale_artifacts_shows_every_stale_item_and_is_healthy_when_all_are_reviewed() -> None:
    row = next(s for s in health_signals(Assessment(stale_derived=4, stale_unreviewed=0))
               if s.name == "stale_artifacts")
    assert (row.value, row.healthy) == (4, True)


async def test_a_proposed_skill_awaits_a_verdict_until_one_is_recorded(
    store: SqliteEventStore,
) -> None:
    board = SkillBoard(store)
    await board.propose("s1", skill_body())
    await board.propose("s2", skill_body(name="other"))
    assert (await skill_health(store, POLICY)).awaiting == ("s1", "s2")
    await board.decide("s1", POLICY)
    assert (await skill_health(store, POLICY)).awaiting == ("s2",)


async def test_a_trial_whose_quota_of_outcomes_is_in_awaits_its_verdict(
    store: SqliteEventStore,
) -> None:
    board = SkillBoard(store)
    await trialed(board)
    for _ in range(POLICY.quota - 1):
        await applied(board, "s1", True)
    assert (await skill_health(store, POLICY)).awaiting == ()
    await applied(board, "s1", True)
    assert (await skill_health(store, POLICY)).awaiting == ("s1",)


async def test_a_trial_is_starved_when_its_family_is_observed_but_never_under_it(
    store: SqliteEventStore,
) -> None:
    board = SkillBoard(store)
    await trialed(board)
    await baseline(board, POLICY.quota - 1, 0)
    assert (await skill_health(store, POLICY)).starved == ()
    await baseline(board, 0, 1)
    assert (await skill_health(store, POLICY)).starved == ("s1",)
    await applied(board, "s1", True)
    assert (await skill_health(store, POLICY)).starved == ()


async def test_an_actors_own_reports_do_not_starve_a_trial(store: SqliteEventStore) -> None:
    board = SkillBoard(store)
    await trialed(board)
    for _ in range(POLICY.quota):
        await board.observe(OutcomeObserved(task_family=FAMILY, success=True, actor="agent",
                                            observer="agent"))
    assert (await skill_health(store, POLICY)).starved == ()


async def test_the_cycle_reports_both_skill_signals_over_what_it_leaves(
    store: SqliteEventStore,
) -> None:
    clock = ManualClock()
    board = SkillBoard(store, "agent")
    await board.propose("brew", SkillProposed(name="brew coffee", task_family="coffee"))
    first = await run_cycle(store, clock=clock)
    assert first.assessment.skills_awaiting_verdict == 1  # before its verdict step
    assert first.signal("skills_awaiting_verdict").value == 0  # after it
    for _ in range(VerdictPolicy().quota):
        await board.observe(OutcomeObserved(task_family="coffee", success=True,
                                            actor="agent", observer="human:ana"))
    clock.advance(86_400_000)
    second = await run_cycle(store, clock=clock)
    starved = second.signal("trials_starved_of_outcomes")
    assert (starved.value, starved.healthy) == (1, False)
    assert not second.healthy
    assert msgspec.json.decode(msgspec.json.encode(second), type=type(second)) == second
