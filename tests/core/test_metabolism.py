"""Mnemonic metabolism: bounded, crash-safe decay of memory strength that never touches truth."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_core._errors import InvalidTransition
from pulse_core._events import EventDraft
from pulse_core._projector import Projector
from pulse_core.maintenance import ElementsReader
from pulse_core.maintenance._metabolism import (
    DecayPolicy,
    decayed_strength,
    reinforce,
    set_salience,
    sweep,
)
from pulse_core.memory import Memory, MemoryBoard
from pulse_core.store import SqliteEventStore
from pulse_core.store._base import EventStore

POLICY = DecayPolicy(factor=0.5, floor=0.05, protection=0.8, limit=2)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EventStore]:
    opened = await SqliteEventStore.open(tmp_path / "events.db")
    yield opened
    await opened.close()


async def seed(store: EventStore, strengths: list[list[float]]) -> dict[str, float]:
    """State items with the given starting strengths, one identity per inner list;
    returns the starting strength of each element id."""
    board = MemoryBoard(store)
    reader = ElementsReader(store)
    start: dict[str, float] = {}
    for i, row in enumerate(strengths):
        for j, strength in enumerate(row):
            await board.set_state(f"p{i}", f"s{j}", j, confidence=0.3 + 0.1 * j)
            if strength != 1.0:
                await reinforce(store, reader, f"p{i}", f"s{j}", strength=strength)
            start[f"p{i}/s{j}"] = strength
    return start


def test_the_policy_refuses_values_that_would_not_converge() -> None:
    for bad in ({"factor": 1.0}, {"factor": 0.0}, {"floor": 1.0}, {"floor": -0.1},
                {"limit": 0}, {"protection": 0.0}, {"factor": float("nan")}):
        with pytest.raises(ValueError):
            DecayPolicy(**bad)
    assert decayed_strength(0.06, DecayPolicy()) == 0.0582
    assert decayed_strength(0.051, DecayPolicy()) == 0.05  # never below the floor


async def test_a_sweep_runs_bounded_batches_until_one_is_short(store: EventStore) -> None:
    await seed(store, [[1.0, 1.0, 1.0], [1.0, 0.05]])
    reader = ElementsReader(store)
    report = await sweep(store, reader, cycle_start=1_000, policy=POLICY)
    assert (report.decayed, report.batches, report.complete) == (4, 2, True)
    metabolized = await store.read(kinds=["memory-metabolized"])
    assert (report.writes, report.events) == (len({e.tx for e in metabolized}),
                                              len(metabolized))
    state = await reader.current()
    assert state.elements["p0/s0"].strength == 0.5
    assert state.elements["p0/s0"].last_metabolized_at == 1_000
    assert state.elements["p1/s1"].strength == 0.05  # at the floor: left alone
    again = await sweep(store, reader, cycle_start=1_000, policy=POLICY)
    assert again.decayed == 0 and again.writes == 0
    later = await sweep(store, reader, cycle_start=2_000, policy=POLICY)
    assert later.decayed == 4 and (await reader.current()).elements["p0/s0"].strength == 0.25


async def test_salience_and_legal_hold_protect_and_are_counted(store: EventStore) -> None:
    await seed(store, [[1.0, 1.0, 1.0]])
    reader = ElementsReader(store)
    await set_salience(store, reader, "p0", "s0", 0.8)
    await store.append([EventDraft("legal-hold-set", "identity:p0", {"record": "s1"},
                                   origin="human")])
    report = await sweep(store, reader, cycle_start=1_000, policy=POLICY)
    assert (report.decayed, report.protected) == (1, 2)
    state = await reader.current()
    assert state.elements["p0/s0"].strength == state.elements["p0/s1"].strength == 1.0


async def test_an_element_changed_after_the_sweep_queued_it_is_judged_again(
    store: EventStore,
) -> None:
    """The sweep finds its queue once; before each batch an element that is no longer the
    one queued (a salience raised meanwhile) is judged again on the fresh read."""
    await seed(store, [[1.0, 1.0], [1.0, 1.0]])  # two batches of limit 2: p0's, then p1's
    reader = ElementsReader(store)
    batches = 0

    async def authorize() -> dict[str, int]:
        nonlocal batches
        batches += 1
        if batches == 2:  # after the queue was made, before p1's batch
            await set_salience(store, reader, "p1", "s0", 0.9)
        return {}

    report = await sweep(store, reader, cycle_start=1_000, policy=POLICY, authorize=authorize)
    state = await reader.current()
    assert state.elements["p1/s0"].strength == 1.0  # protected by the time its batch ran
    assert state.elements["p1/s1"].strength == state.elements["p0/s0"].strength == 0.5
    assert report.decayed == 3


async def test_a_pending_or_blocked_high_impact_commitment_never_decays(
    store: EventStore,
) -> None:
    reader = ElementsReader(store)
    made = [EventDraft("commitment-made", "identity:ana", {"record": f"c-{status}", "text": "call",
                                                           "impact": impact}, origin="agent")
            for status, impact in (("pending", "high"), ("blocked", "high"),
                                   ("fulfilled", "high"), ("low", "normal"))]
    await store.append(made)
    await store.append([EventDraft("commitment-updated", "identity:ana",
                                   {"record": f"c-{status}", "status": status}, origin="agent")
                        for status in ("blocked", "fulfilled")])
    for status in ("pending", "blocked", "fulfilled"):  # salience alone no longer shields
        await set_salience(store, reader, "ana", f"c-{status}", 0.0)
    report = await sweep(store, reader, cycle_start=1_000, policy=POLICY)
    state = await reader.current()
    blocked = state.elements["ana/c-blocked"].commitment
    assert blocked is not None and blocked.status == "blocked"
    strengths = {r: state.elements[f"ana/c-{r}"].strength for r in
                 ("pending", "blocked", "fulfilled", "low")}
    assert strengths == {"pending": 1.0, "blocked": 1.0, "fulfilled": 0.5, "low": 0.5}
    assert (report.decayed, report.protected) == (2, 2)


async def test_a_sweep_writes_with_the_expected_version_and_defers_after_one_retry(
    store: EventStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    await seed(store, [[1.0], [1.0]])
    reader = ElementsReader(store)
    real = store.append
    calls = {"n": 0}

    async def racing(drafts, expect=None):  # type: ignore[no-untyped-def]
        if drafts and drafts[0].kind == "memory-metabolized":
            calls["n"] += 1
            if any(d.key == "identity:p0" for d in drafts):
                await real([EventDraft("human-exchange", "identity:p0",
                                       {"record": f"x-{calls['n']}", "text": "hi"},
                                       origin="human")])
        return await real(drafts, expect=expect)

    monkeypatch.setattr(store, "append", racing)
    report = await sweep(store, reader, cycle_start=1_000, policy=POLICY)
    monkeypatch.undo()
    assert report.conflicts == 3 and report.deferred == ("p0/s0",)
    state = await reader.current()
    assert state.elements["p1/s0"].strength == 0.5  # the other identity went through
    assert state.elements["p0/s0"].strength == 1.0  # deferred, not lost: next run decays it
    # the deferred one and the three exchanges the race wrote
    assert (await sweep(store, reader, cycle_start=1_000, policy=POLICY)).decayed == 4


async def test_after_a_conflict_the_identities_that_did_not_move_are_written_in_one_append(
    store: EventStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A large batch is not written identity by identity because one identity moved: only
    the one that moved is; the rest go again as one append on the fresh read."""
    await seed(store, [[1.0], [1.0], [1.0], [1.0]])
    reader = ElementsReader(store)
    real = store.append
    raced = False

    async def racing(drafts, expect=None):  # type: ignore[no-untyped-def]
        nonlocal raced
        if drafts and drafts[0].kind == "memory-metabolized" and not raced:
            raced = True  # p2 moves once, between the sweep's read and its first append
            await real([EventDraft("human-exchange", "identity:p2",
                                   {"record": "x-1", "text": "hi"}, origin="human")])
        return await real(drafts, expect=expect)

    monkeypatch.setattr(store, "append", racing)
    report = await sweep(store, reader, cycle_start=1_000,
                         policy=DecayPolicy(factor=0.5, floor=0.05, limit=10))
    monkeypatch.undo()
    written = await store.read(kinds=["memory-metabolized"])
    by_tx: dict[str, list[str]] = {}
    for event in written:
        by_tx.setdefault(event.tx, []).append(event.key)
    assert sorted(by_tx.values()) == [["identity:p0", "identity:p1", "identity:p3"],
                                      ["identity:p2"]]
    assert (report.decayed, report.conflicts, report.writes, report.deferred) == (4, 1, 2, ())
    state = await reader.current()
    assert {state.elements[f"p{i}/s0"].strength for i in range(4)} == {0.5}


async def test_reinforce_and_salience_refuse_unknown_records_and_stale_versions(
    store: EventStore,
) -> None:
    await seed(store, [[1.0]])
    reader = ElementsReader(store)
    with pytest.raises(InvalidTransition, match="no live element"):
        await reinforce(store, reader, "p0", "nope")
    with pytest.raises(ValueError):
        await set_salience(store, reader, "p0", "s0", 1.5)
    event = await reinforce(store, reader, "p0", "s0", strength=0.4, reason="used")
    assert event.kind == "memory-reinforced"
    assert (await reader.current()).elements["p0/s0"].strength == 0.4


# -- the property ----------------------------------------------------------------------------

STRENGTHS = st.sampled_from([1.0, 0.5, 0.3, 0.06, 0.05])
STEP = st.one_of(
    st.tuples(st.just("sweep"), st.sampled_from([None, 1, 2]), st.integers(1, 3)),
    st.tuples(st.just("cancel"), st.integers(0, 6), st.integers(1, 3)),
    st.tuples(st.just("reopen"), st.just(0), st.just(1)),
)


async def confidences(store: EventStore) -> dict[tuple[str, str], float]:
    """Every state item's confidence, by (identity, item)."""
    memory = (await Projector(store, [Memory()]).catch_up())["memory"]
    return {(i, k): v.confidence for i, m in memory.items() for k, v in m.state.items()}


async def crash_scenario(folder: Path, rows: list[list[float]],
                         steps: list[tuple[str, int | None, int]]) -> None:
    path = folder / "events.db"
    store = await SqliteEventStore.open(path)
    start = await seed(store, rows)
    reader = ElementsReader(store)
    confidence = await confidences(store)
    for op, arg, limit in steps:
        policy = DecayPolicy(factor=0.5, floor=0.05, limit=limit)
        if op == "sweep":
            await sweep(store, reader, cycle_start=1_000, policy=policy, max_batches=arg)
        elif op == "cancel":
            task = asyncio.create_task(sweep(store, reader, cycle_start=1_000, policy=policy))
            for _ in range(arg or 0):
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await store.close()  # the crash: a brand-new store and reader over the file
            store = await SqliteEventStore.open(path)
            reader = ElementsReader(store)
        else:
            await store.close()
            store = await SqliteEventStore.open(path)
            reader = ElementsReader(store)
        state = await reader.current()
        for eid, initial in start.items():
            once = decayed_strength(initial, policy)
            assert state.elements[eid].strength in (initial, once), (eid, steps)
    await sweep(store, ElementsReader(store), cycle_start=1_000,
                policy=DecayPolicy(factor=0.5, floor=0.05, limit=2))
    state = await ElementsReader(store).current()
    for eid, initial in start.items():
        assert state.elements[eid].strength == max(0.05, round(initial * 0.5, 6)), eid
    for cycle in (2_000, 3_000, 4_000):
        await sweep(store, ElementsReader(store), cycle_start=cycle, policy=POLICY)
    assert await confidences(store) == confidence
    await store.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.lists(STRENGTHS, min_size=1, max_size=3), min_size=1, max_size=3),
       steps=st.lists(STEP, max_size=6))
def test_sweeps_crashes_and_reruns_decay_each_element_at_most_once(
    rows: list[list[float]], steps: list[tuple[str, int | None, int]],
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(crash_scenario(Path(folder), rows, steps))
