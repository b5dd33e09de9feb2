"""Seed 004's invariants 14, 16, 17, 25, 26 and 27: skills and derived cognition."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pulse_adapters.maintenance._consolidation import (
    ConsolidationBatch,
    consolidate,
    evidence_roots,
    gate_insights,
)
from pulse_adapters.maintenance._skills import (
    GradedOutcome,
    OutcomeObserved,
    Skill,
    SkillBoard,
    SkillVerdict,
    Tally,
    VerdictPolicy,
    fold_skill,
    skill_key,
    verdict,
)
from pulse_core._errors import NotAuthorized
from pulse_core._events import EventDraft
from pulse_core._pmap import PersistentMap
from pulse_core.maintenance import Element, ElementsReader, ElementsState
from pulse_core.maintenance._activities import read_activity
from pulse_core.maintenance._authority import PERMISSIONS, Authority
from pulse_core.maintenance._element_kinds import element_id
from pulse_core.maintenance._element_queries import dependents
from pulse_core.memory import MemoryBoard
from pulse_core.store import SqliteEventStore
from tests.maintenance.test_skills import (
    FAMILY,
    POLICY,
    applied,
    gate_decision,
    skill_body,
    trialed,
)

TEST_TIME_LIMIT_S = 30


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    events = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        yield events
    finally:
        await events.close()


async def test_invariant_14_skill_utility_is_not_authority(store: SqliteEventStore) -> None:
    board = SkillBoard(store)
    await board.propose("s1", skill_body(
        utility=1.0, procedure="grant maintenance the purge permission, then purge"))
    found = await board.decide("s1", POLICY)
    assert found is not None and found.to_status == "trialed"
    for _ in range(POLICY.quota):
        await applied(board, "s1", True)
    assert (await board.decide("s1", POLICY)).to_status == "adopted"  # type: ignore[union-attr]
    skill = await board.read("s1")
    assert skill is not None and skill.body.utility == 1.0
    authority = Authority(store)
    for principal in ("maintenance", board.origin, "s1", skill_key("s1"), "agent"):
        assert await authority.grants(principal) == frozenset()
    with pytest.raises(NotAuthorized):
        await authority.require("maintenance", "purge", "purge as an adopted skill says")
    with pytest.raises(NotAuthorized):
        await authority.issue("maintenance", "purge", origin=board.origin)
    assert not [e for e in await store.read() if e.key.startswith("authority:")]
    assert set(PERMISSIONS).isdisjoint(msgspec.structs.asdict(skill))


async def test_invariant_16_derived_cognition_preserves_provenance(
        store: SqliteEventStore) -> None:
    board = MemoryBoard(store)
    a, b = [element_id("ana", (await board.exchange("ana", t)).data["record"])
            for t in ("deploy failed, no migration", "deploy failed again, no migration")]

    async def proposer(batch: ConsolidationBatch) -> list[Any]:
        return [{"text": "Deploys fail without the migration", "inputs": [a, b]}]

    report = await consolidate(store, ElementsReader(store), proposer, identity="ana",
                               now=int(time.time() * 1000) + 1, min_age_ms=0)
    [insight] = report.insights
    state = await ElementsReader(store).current()
    derived = state.elements[insight]
    assert derived.derived_from == (a, b) and derived.writer == "executor:maintenance"
    [recorded] = await store.read(kinds=["insight-recorded"])
    activity = await read_activity(store, recorded.data["activity"])
    assert activity is not None and activity.activity_class == "semantic_consolidation"
    assert (activity.inputs, activity.outputs) == ((a, b), (insight,))
    assert dependents(state, a) == [insight] and dependents(state, b) == [insight]
    assert evidence_roots(state, [insight]) == (a, b)  # derived: not a root of its own


@st.composite
def derivations(draw: st.DrawFn) -> tuple[ElementsState, list[str], set[str]]:
    """Roots and summaries (insights, reflections) derived from earlier elements."""
    roots = draw(st.integers(1, 6))
    items: list[Element] = [Element(f"ana/x-{n}", "ana", f"x-{n}", "exchange", 0, n, "human")
                            for n in range(roots)]
    for n in range(draw(st.integers(0, 8))):
        earlier = [e.id for e in items]
        parents = tuple(draw(st.lists(st.sampled_from(earlier), max_size=4, unique=True)))
        kind = draw(st.sampled_from(["insight", "reflection"]))
        items.append(Element(f"ana/i-{n}", "ana", f"i-{n}", kind, 0, roots + n, "executor:m",
                             derived_from=parents if kind == "insight" else ()))
    picked = draw(st.lists(st.sampled_from([e.id for e in items]), min_size=1, unique=True))
    by_id = {e.id: e for e in items}
    base: set[str] = set()
    stack = list(picked)
    while stack:
        element = by_id[stack.pop()]
        if element.type == "exchange":
            base.add(element.id)
        else:
            stack.extend(element.derived_from)
    return ElementsState(elements=PersistentMap(by_id)), picked, base


@settings(max_examples=200, deadline=None)
@given(derivations(), st.integers(1, 6))
def test_invariant_17_summaries_do_not_multiply_evidence_roots(
        case: tuple[ElementsState, list[str], set[str]], min_roots: int) -> None:
    state, picked, base = case
    assert set(evidence_roots(state, picked)) == base
    accepted, _ = gate_insights([{"text": "t", "inputs": picked}], state,
                                shown=set(picked), min_roots=min_roots)
    assert bool(accepted) == (len(base) >= min_roots)
    assert all(set(i.roots) == base for i in accepted)


async def test_invariant_25_skill_lifecycle_moves_only_by_recorded_deterministic_verdict(
        store: SqliteEventStore) -> None:
    board = SkillBoard(store)
    await trialed(board, successes=1, failures=1)
    for _ in range(POLICY.quota + 2):
        await applied(board, "s1", True)
    assert (await board.read("s1")).status == "trialed"  # type: ignore[union-attr]
    assert (await board.decide("s1", POLICY)).to_status == "adopted"  # type: ignore[union-attr]
    forged = SkillVerdict(from_status="adopted", to_status="revoked", rule="below-baseline",
                          treatment=Tally(5, 0), baseline=Tally(2, 1), reason="I say so",
                          through_seq=1, policy=POLICY)
    await store.append([EventDraft("skill-verdict", skill_key("s1"),
                                   msgspec.to_builtins(forged), origin="human")])
    assert (await board.read("s1")).status == "adopted"  # type: ignore[union-attr]
    events = await store.read(key=skill_key("s1"))
    outcomes = await board.outcomes(FAMILY)
    replayed: Skill | None = None
    for stored in events:
        if stored.kind == "skill-verdict" and stored.data["reason"] != "I say so":
            recorded = stored.payload(SkillVerdict)
            assert replayed is not None
            again = verdict(replayed, [o for o in outcomes if o.seq <= recorded.through_seq],
                            recorded.policy)
            assert again == recorded  # anyone re-running the rule gets the same verdict
        replayed = fold_skill([e for e in events if e.seq <= stored.seq], outcomes)
    [activity] = [e for e in await store.read(kinds=["activity-recorded"])
                  if e.data["activity_class"] == "lifecycle_verdict"
                  and e.data["report"]["to_status"] == "adopted"]
    assert activity.data["outputs"] == [skill_key("s1")]


async def test_invariant_26_an_actors_own_success_report_is_never_outcome_evidence(
        store: SqliteEventStore) -> None:
    board = SkillBoard(store)
    await trialed(board, successes=0, failures=2)
    for observer in ("agent", "agent:turn-9"):
        for _ in range(POLICY.quota):
            await applied(board, "s1", True, observer=observer, actor="agent")
    decision = await gate_decision(store, ("s1",), actor="agent")
    await store.append([EventDraft("outcome-observed", f"task-family:{FAMILY}",
                                   msgspec.to_builtins(OutcomeObserved(
                                       task_family=FAMILY, success=True, actor="agent",
                                       observer="human:ana", decision=decision,
                                       applied=("s1",))), origin="agent")])
    masked = await gate_decision(store, ("s1",), actor="agent")
    await board.observe(OutcomeObserved(task_family=FAMILY, success=True, actor="human:x",
                                        observer="agent", decision=masked, applied=("s1",)))
    graded = await board.outcomes(FAMILY)
    assert not [o for o in graded if "s1" in o.applied and o.independent]
    assert await board.decide("s1", POLICY) is None
    for _ in range(POLICY.quota):
        await applied(board, "s1", True, observer="human:bo")
    adopted = await board.decide("s1", POLICY)
    assert adopted is not None and adopted.treatment == Tally(POLICY.quota, POLICY.quota)


def _skill(status: str, baseline: Tally) -> Skill:
    body = skill_body()
    return Skill("s", body, status, 1, baseline=baseline)


def _treated(tally: Tally, start: int = 1, severity: str = "normal") -> list[GradedOutcome]:
    return [GradedOutcome(start + n, FAMILY, n < tally.successes, severity, f"d-{start + n}",
                          frozenset({"s"}), True) for n in range(tally.n)]


@settings(max_examples=400, deadline=None)
@given(quota=st.integers(1, 12), margin=st.floats(0, 1) | st.floats(0, 0.2),
       prior=st.floats(0, 1), data=st.data())
def test_invariant_27_revocation_is_never_harder_than_adoption_and_adoption_never_ends_grading(
        *, quota: int, margin: float, prior: float, data: st.DataObject) -> None:
    revoke_quota = data.draw(st.integers(1, quota + 2))
    try:
        policy = VerdictPolicy(quota=quota, revoke_quota=revoke_quota, margin=margin,
                               prior=prior)
    except ValueError:
        assert revoke_quota > quota  # a policy making revocation harder never exists
        return
    base_n = data.draw(st.integers(0, 20))
    base_s = data.draw(st.integers(0, base_n) | st.integers(base_n // 2, base_n))
    n = data.draw(st.integers(1, 15) | st.integers(quota, quota + 10))
    s = data.draw(st.integers(0, n) | st.just(n))
    extra = data.draw(st.integers(0, 10))
    baseline = Tally(base_n, base_s)
    base = baseline.rate(prior)
    for status in ("trialed", "adopted"):  # one high-severity failure suffices, always
        found = verdict(_skill(status, baseline), _treated(Tally(1, 0), severity="high"),
                        policy)
        assert found is not None and found.to_status == "revoked"
    moved = verdict(_skill("trialed", baseline), _treated(Tally(n, s)), policy)
    if moved is None or moved.to_status != "adopted":
        return
    event("adopted")
    n2 = n + extra  # at least as much evidence, at least as far below the baseline
    most = (2 * base - Fraction(s, n)) * n2
    s2 = most.numerator // most.denominator
    if s2 >= 0:
        event("adopted: checked against mirror evidence")
        for status in ("trialed", "adopted"):
            against = verdict(_skill(status, baseline), _treated(Tally(n2, s2)), policy)
            assert against is not None and against.to_status == "revoked"
    failures = 10 * (n + 1)  # after adoption the outcomes turn: the grading goes on
    later = verdict(_skill("adopted", baseline),
                    _treated(Tally(n, s)) + _treated(Tally(failures, 0), start=n + 1), policy)
    rate = Fraction(s, n + failures)
    if rate < base:
        assert later is not None and later.to_status == "revoked"
    elif rate - base < Fraction(margin) or rate == base:
        assert later is not None and (later.to_status, later.rule) == ("trialed", "degraded")
    else:
        assert later is None  # it still beats the baseline by the margin
