"""Why an event is in the log (pulse_core.causes_of): its cause chain, nearest first, up to
the first event a tick recorded, and that tick (the `tick` event of the same append)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pulse_core import (
    Decision,
    Effect,
    Engine,
    EventDraft,
    ExecutionContext,
    Executor,
    Inner,
    Snapshot,
    SqliteEventStore,
    causes_of,
    event_at,
)
from pulse_core._effects import effect_draft
from pulse_core._history import CAUSE_DEPTH


class Decided(Effect, tag="history-test-decided"):
    """An effect the test's rule decides at its first tick."""

    n: int


class Runs(Executor):
    handles = (Decided,)

    async def execute(self, effect: Decided, ctx: ExecutionContext) -> dict[str, int]:
        return {"n": effect.n}


async def decide_once(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    decision = await inner(prev, curr)
    if curr.number == 1:
        return Decision(effects=[*decision.effects, Decided(n=1)], tick_ms=decision.tick_ms)
    return decision


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    opened = await SqliteEventStore.open(tmp_path / "events.db")
    yield opened
    await opened.close()


async def test_an_outcome_leads_back_to_its_effect_and_the_tick_that_decided_it(
        tmp_path: Path) -> None:
    async with Engine(tmp_path, rules=[decide_once], executors=[Runs()]) as engine:
        await engine.step()
        await engine.step()
        [effect] = await engine.events.read(kinds=["effect"])
        [acked] = await engine.events.read(kinds=["effect-acked"], key=effect.key)
        [tick] = await engine.events.read(kinds=["tick"])
        from_ack = await causes_of(engine.events, acked)
        from_effect = await causes_of(engine.events, effect)
        from_tick = await causes_of(engine.events, tick)
    assert [e.seq for e in from_ack.chain] == [effect.seq]
    assert from_ack.tick == tick and from_ack.missing is None
    assert tick.tx == effect.tx and tick.data["number"] == 1
    assert from_effect.chain == [] and from_effect.tick == tick  # ends at the tick's record
    assert from_tick.chain == [] and from_tick.tick is None


async def test_an_agents_chain_is_followed_to_a_cause_that_cannot_be_read(
        store: SqliteEventStore) -> None:
    first = (await store.append([EventDraft("engine-started", "engine", {}, "engine")])
             ).events[0]
    effect = (await store.append([effect_draft(Decided(n=2), "agent", cause=first.seq)])
              ).events[0]
    note = (await store.append([EventDraft("engine-started", "engine", {}, "engine",
                                           cause=effect.seq)])).events[0]
    # a tick recorded later, in another append, did not decide the agent's effect
    await store.append([EventDraft("tick", "engine", {"number": 1}, "engine")])
    found = await causes_of(store, note)
    assert [e.seq for e in found.chain] == [effect.seq, first.seq]
    assert found.tick is None and found.missing is None
    dangling = (await store.append([EventDraft("engine-started", "engine", {}, "engine",
                                               cause=999)])).events[0]
    assert await causes_of(store, dangling) == type(found)([], 999, None)
    assert await event_at(store, 999) is None and await event_at(store, 0) is None


async def test_a_chain_is_followed_at_most_cause_depth_back(store: SqliteEventStore) -> None:
    cause = None
    for _ in range(CAUSE_DEPTH + 3):
        cause = (await store.append([EventDraft("engine-started", "engine", {}, "engine",
                                                cause=cause)])).events[0].seq
    last = await event_at(store, cause or 0)
    assert last is not None
    assert len((await causes_of(store, last)).chain) == CAUSE_DEPTH
