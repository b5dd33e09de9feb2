"""Skills: proposal, graded outcomes and the deterministic lifecycle verdict, over a real log."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from pulse_adapters.maintenance._skills import (
    OutcomeObserved,
    SkillBoard,
    SkillProposed,
    SkillVerdict,
    Tally,
    VerdictPolicy,
    family_key,
    same_actor,
    skill_key,
)
from pulse_core._errors import InvalidEvent, InvalidTransition
from pulse_core._events import EventDraft, uuid7
from pulse_core.maintenance._activities import ActivityBody, activity_draft, read_activity
from pulse_core.store import SqliteEventStore
from pulse_core.store._base import EventStore

TEST_TIME_LIMIT_S = 20
FAMILY = "deploy/pre-flight"
POLICY = VerdictPolicy(quota=3, margin=0.1, revoke_quota=2)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    events = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        yield events
    finally:
        await events.close()


@pytest.fixture
def board(store: SqliteEventStore) -> SkillBoard:
    return SkillBoard(store)


def skill_body(**changes: object) -> SkillProposed:
    base = SkillProposed(name="Deploy with pre-flight migration check", task_family=FAMILY,
                         summary="check the migration first", procedure="1. check 2. deploy",
                         compiled_from=("ana/x-1", "ana/x-2"))
    return msgspec.structs.replace(base, **changes)


async def gate_decision(store: EventStore, skills: tuple[str, ...], *,
                        actor: str = "agent", activity_class: str = "action_gate") -> str:
    """An action_gate activity that applied `skills` (its inputs name them)."""
    decision = f"action_gate:{uuid7()}"
    await store.append([activity_draft(decision, ActivityBody(
        activity_class=activity_class, actors=(actor,),
        inputs=tuple(skill_key(s) for s in skills), report={"decision": "act"}),
        origin=actor)])
    return decision


async def applied(board: SkillBoard, skill: str, success: bool, *, severity: str = "normal",
                  observer: str = "human:ana", actor: str = "agent") -> None:
    """One outcome of a decision that applied `skill`, observed by `observer`."""
    decision = await gate_decision(board.store, (skill,), actor=actor)
    await board.observe(OutcomeObserved(task_family=FAMILY, success=success, actor=actor,
                                        observer=observer, severity=severity,
                                        decision=decision, applied=(skill,)))


async def baseline(board: SkillBoard, successes: int, failures: int) -> None:
    """Family outcomes that applied no skill."""
    for success in [True] * successes + [False] * failures:
        await board.observe(OutcomeObserved(task_family=FAMILY, success=success,
                                            actor="agent", observer="human:ana"))


async def trialed(board: SkillBoard, skill: str = "s1", *, successes: int = 1,
                  failures: int = 1) -> None:
    """A proposed skill whose trial opened over a baseline of successes/failures."""
    await baseline(board, successes, failures)
    await board.propose(skill, skill_body())
    found = await board.decide(skill, POLICY)
    assert found is not None and found.to_status == "trialed"


async def test_a_skill_without_a_task_family_is_refused(store: SqliteEventStore) -> None:
    with pytest.raises(ValueError, match="task_family"):
        skill_body(task_family="")
    raw = EventDraft("skill-proposed", skill_key("s1"), {"name": "n", "task_family": " "},
                     origin="executor:maintenance")
    with pytest.raises(InvalidEvent, match="task_family"):
        await store.append([raw])
    assert await store.last_seq() == 0


async def test_propose_records_the_skill_and_its_compilation_in_one_append(
        board: SkillBoard) -> None:
    event = await board.propose("s1", skill_body())
    skill = await board.read("s1")
    assert skill is not None and skill.status == "proposed" and skill.body.utility == 0.5
    compiled = await read_activity(board.store, "skill_compilation:s1:0")
    assert compiled is not None and compiled.inputs == ("ana/x-1", "ana/x-2")
    assert compiled.outputs == (skill_key("s1"),) and compiled.seq == event.seq + 1
    with pytest.raises(InvalidTransition, match="proposed"):
        await board.propose("s1", skill_body())


async def test_opening_a_trial_freezes_the_baseline_of_the_family_so_far(
        board: SkillBoard) -> None:
    await trialed(board, successes=1, failures=3)
    await baseline(board, 5, 0)  # later outcomes never move a frozen baseline
    skill = await board.read("s1")
    assert skill is not None and skill.status == "trialed"
    assert skill.baseline == Tally(4, 1)


async def test_adoption_needs_the_quota_and_a_rate_beating_the_baseline(
        board: SkillBoard) -> None:
    await trialed(board, successes=1, failures=1)
    for _ in range(POLICY.quota - 1):
        await applied(board, "s1", True)
    assert await board.decide("s1", POLICY) is None  # one short of the quota
    await applied(board, "s1", True)
    found = await board.decide("s1", POLICY)
    assert found is not None and (found.to_status, found.rule) == ("adopted", "beats-baseline")
    assert found.treatment == Tally(3, 3) and found.baseline == Tally(2, 1)
    skill = await board.read("s1")
    assert skill is not None and skill.status == "adopted"


async def test_a_rate_that_does_not_beat_the_baseline_by_the_margin_is_not_adopted(
        board: SkillBoard) -> None:
    await trialed(board, successes=2, failures=1)  # baseline 2/3
    for success in (True, True, False):
        await applied(board, "s1", success)  # 2/3: equal, not better
    assert await board.decide("s1", POLICY) is None
    assert (await board.read("s1")).status == "trialed"  # type: ignore[union-attr]


async def test_one_high_severity_failure_under_the_skill_revokes_it(board: SkillBoard) -> None:
    await trialed(board)
    await applied(board, "s1", False, severity="high")
    found = await board.decide("s1", POLICY)
    assert found is not None and (found.to_status, found.rule) == (
        "revoked", "high-severity-failure")


async def test_a_treatment_rate_below_the_baseline_revokes(board: SkillBoard) -> None:
    await trialed(board, successes=1, failures=1)
    await applied(board, "s1", False)
    assert await board.decide("s1", POLICY) is None  # under revoke_quota
    await applied(board, "s1", False)
    found = await board.decide("s1", POLICY)
    assert found is not None and (found.to_status, found.rule) == ("revoked", "below-baseline")


async def test_an_adopted_skill_that_degrades_goes_back_on_trial(board: SkillBoard) -> None:
    await trialed(board, successes=1, failures=1)
    for _ in range(3):
        await applied(board, "s1", True)
    assert (await board.decide("s1", POLICY)).to_status == "adopted"  # type: ignore[union-attr]
    for _ in range(2):
        await applied(board, "s1", False)  # 3/5 = 0.6 < 0.5 + 0.1, still above 0.5
    found = await board.decide("s1", POLICY)
    assert found is not None and (found.from_status, found.to_status, found.rule) == (
        "adopted", "trialed", "degraded")


async def test_re_entry_after_revocation_opens_a_new_trial_with_a_fresh_baseline(
        board: SkillBoard) -> None:
    await trialed(board, successes=1, failures=1)
    await applied(board, "s1", False, severity="high")
    await board.decide("s1", POLICY)
    assert await board.decide("s1", POLICY) is None  # revoked stays revoked by itself
    await baseline(board, 3, 0)
    await board.propose("s1", skill_body(procedure="1. check twice 2. deploy"))
    assert (await board.read("s1")).status == "revoked"  # type: ignore[union-attr]
    found = await board.decide("s1", POLICY)
    assert found is not None and (found.to_status, found.rule) == ("trialed", "trial-reopened")
    skill = await board.read("s1")
    assert skill is not None and skill.baseline == Tally(5, 4)
    assert await board.decide("s1", POLICY) is None  # the old failure is not in the new trial


async def test_a_revision_keeps_the_task_family_that_grades_it(board: SkillBoard) -> None:
    await trialed(board)
    await applied(board, "s1", False, severity="high")
    await board.decide("s1", POLICY)
    with pytest.raises(InvalidTransition, match="task_family"):
        await board.propose("s1", skill_body(task_family="deploy/other"))


async def test_an_event_written_on_the_key_before_the_proposal_moves_nothing(
        board: SkillBoard) -> None:
    forged = SkillVerdict(from_status="proposed", to_status="adopted", rule="beats-baseline",
                          treatment=Tally(9, 9), baseline=Tally(), reason="early",
                          through_seq=0, policy=POLICY)
    await board.store.append([EventDraft("skill-verdict", skill_key("s1"),
                                         msgspec.to_builtins(forged), origin="agent")])
    assert await board.read("s1") is None
    await board.propose("s1", skill_body())
    found = await board.decide("s1", POLICY)
    assert found is not None and found.to_status == "trialed"


async def test_only_outcomes_of_decisions_that_named_the_skill_are_treatment(
        board: SkillBoard) -> None:
    await trialed(board, successes=0, failures=2)
    other = await gate_decision(board.store, ("s2",))
    watch = await gate_decision(board.store, ("s1",), activity_class="watch_fire")
    for decision in (other, watch, "action_gate:missing"):
        for _ in range(3):
            await board.observe(OutcomeObserved(
                task_family=FAMILY, success=True, actor="agent", observer="human:ana",
                decision=decision, applied=("s1",)))
    late = f"action_gate:{uuid7()}"
    await board.observe(OutcomeObserved(task_family=FAMILY, success=True, actor="agent",
                                        observer="human:ana", decision=late, applied=("s1",)))
    await board.store.append([activity_draft(late, ActivityBody(
        activity_class="action_gate", actors=("agent",), inputs=(skill_key("s1"),)),
        origin="agent")])  # recorded after the outcome it would explain
    graded = await board.outcomes(FAMILY)
    assert all("s1" not in o.applied for o in graded)
    assert await board.decide("s1", POLICY) is None


async def test_outcomes_of_one_decision_count_once(board: SkillBoard) -> None:
    await trialed(board, successes=0, failures=2)
    decision = await gate_decision(board.store, ("s1",))
    for observer in ("human:ana", "human:bo", "human:cy"):
        await board.observe(OutcomeObserved(task_family=FAMILY, success=True, actor="agent",
                                            observer=observer, decision=decision,
                                            applied=("s1",)))
    assert await board.decide("s1", POLICY) is None  # one decision: n = 1, not 3


async def test_an_observer_named_in_the_data_but_not_the_origin_is_not_evidence(
        board: SkillBoard) -> None:
    decision = await gate_decision(board.store, ("s1",))
    forged = OutcomeObserved(task_family=FAMILY, success=True, actor="agent",
                             observer="human:ana", decision=decision, applied=("s1",))
    await board.store.append([EventDraft("outcome-observed", family_key(FAMILY),
                                         msgspec.to_builtins(forged), origin="agent")])
    [graded] = await board.outcomes(FAMILY)
    assert graded.applied == {"s1"} and not graded.independent


async def test_a_status_written_any_other_way_than_the_verdict_is_ignored(
        board: SkillBoard) -> None:
    await board.propose("s1", skill_body())
    key = skill_key("s1")
    smuggled = {**msgspec.to_builtins(skill_body()), "status": "adopted"}
    forged = SkillVerdict(from_status="proposed", to_status="adopted", rule="beats-baseline",
                          treatment=Tally(9, 9), baseline=Tally(), reason="trust me",
                          through_seq=0, policy=POLICY)
    wrong_tally = msgspec.structs.replace(forged, to_status="trialed", rule="trial-opened",
                                          baseline=Tally(4, 4))
    for draft in (EventDraft("skill-proposed", key, smuggled, origin="agent"),
                  EventDraft("skill-verdict", key, msgspec.to_builtins(forged), origin="agent"),
                  EventDraft("skill-verdict", key, msgspec.to_builtins(wrong_tally),
                             origin="agent")):
        await board.store.append([draft])
    skill = await board.read("s1")
    assert skill is not None and skill.status == "proposed" and skill.verdicts == 0


async def test_decide_records_the_verdict_and_its_activity_guarded_by_the_skill_version(
        store: SqliteEventStore) -> None:
    first, second = SkillBoard(store), SkillBoard(store)
    await first.propose("s1", skill_body())
    found = await asyncio.gather(first.decide("s1", POLICY), second.decide("s1", POLICY))
    verdicts = await store.read(key=skill_key("s1"), kinds=["skill-verdict"])
    assert len(verdicts) == 1 and sorted(f is None for f in found) == [False, True]
    activity = await read_activity(store, "lifecycle_verdict:s1:1")
    assert activity is not None and activity.activity_class == "lifecycle_verdict"
    assert activity.report["to_status"] == "trialed" and activity.seq == verdicts[0].seq + 1


async def test_a_retried_report_with_an_idempotency_key_writes_nothing_new(
        board: SkillBoard) -> None:
    body = OutcomeObserved(task_family=FAMILY, success=True, actor="agent",
                           observer="human:ana")
    first = await board.observe(body, idem="deploy-41")
    again = await board.observe(body, idem="deploy-41")
    assert again.seq == first.seq and await board.store.last_seq() == first.seq + 1
    assert len(await board.outcomes(FAMILY)) == 1


def test_a_policy_whose_revocation_is_harder_than_adoption_is_refused() -> None:
    with pytest.raises(ValueError, match="never harder"):
        VerdictPolicy(quota=3, revoke_quota=4)


def test_an_actor_and_its_narrower_names_are_one_actor() -> None:
    assert same_actor("agent", "agent:turn-3") and same_actor("agent:turn-3", "agent")
    assert not same_actor("agent:hermes", "agent:openclaw")  # two named agents
    assert not same_actor("agent", "human:ana") and not same_actor("human:ana", "human:bo")
