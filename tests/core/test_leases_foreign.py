"""An event of another kind filed under an effect's key (an operator's note under its id)
moves the key's version but not the effect: the effect still runs and is acked once, its
outcome is still recorded, and cancel and retry still apply."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pulse_core import (
    Effect,
    EventDraft,
    ExecutionContext,
    Executor,
    ExecutorLoop,
    ManualClock,
    SqliteEventStore,
    cancel_effect,
    register_kind,
    retry_effect,
)
from pulse_core._effects import effect_draft

register_kind("leases-note", "an operator's note filed under some key (tests); data: text")


class Errand(Effect, tag="leases-errand"):
    n: int


class Errands(Executor):
    handles = (Errand,)
    max_attempts = 1

    def __init__(self) -> None:
        self.runs: list[tuple[int, int]] = []
        self.entered = asyncio.Event()
        self.gate: asyncio.Event | None = None
        self.fail = False

    async def execute(self, effect: Errand, ctx: ExecutionContext) -> int:
        self.runs.append((effect.n, ctx.attempt))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise ConnectionError("down")
        return effect.n


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    yield store
    await store.close()


def note(key: str) -> EventDraft:
    return EventDraft("leases-note", key, {"text": "looked at this one"}, origin="human:op")


async def _kinds(store: SqliteEventStore, key: str) -> list[str]:
    return [e.kind for e in await store.read(key=key)]


async def test_an_effect_with_a_note_under_its_id_runs_and_is_acked(
        store: SqliteEventStore) -> None:
    (effect,) = (await store.append([effect_draft(Errand(n=1), "agent")])).events
    await store.append([note(effect.key)])
    worker = Errands()
    await asyncio.wait_for(ExecutorLoop(store, [worker], clock=ManualClock()).run_until_idle(),
                           30)
    assert worker.runs == [(1, 1)]
    assert await _kinds(store, effect.key) == [
        "effect", "leases-note", "effect-executing", "effect-acked"]


async def test_a_note_filed_while_the_effect_runs_leaves_its_outcome_recorded(
        store: SqliteEventStore) -> None:
    (effect,) = (await store.append([effect_draft(Errand(n=1), "agent")])).events
    worker = Errands()
    worker.gate = asyncio.Event()
    loop = ExecutorLoop(store, [worker], clock=ManualClock())
    running = asyncio.create_task(loop.run_until_idle())
    await asyncio.wait_for(worker.entered.wait(), 30)
    await store.append([note(effect.key)])
    worker.gate.set()
    await asyncio.wait_for(running, 30)
    assert worker.runs == [(1, 1)]
    assert await _kinds(store, effect.key) == [
        "effect", "effect-executing", "leases-note", "effect-acked"]


async def test_cancel_and_retry_apply_to_an_effect_with_a_note_under_its_id(
        store: SqliteEventStore) -> None:
    (effect,) = (await store.append([effect_draft(Errand(n=1), "agent")])).events
    await store.append([note(effect.key)])
    await asyncio.wait_for(cancel_effect(store, effect.key, reason="not now"), 30)
    await store.append([note(effect.key)])
    await asyncio.wait_for(retry_effect(store, effect.key, reason="now"), 30)
    await store.append([note(effect.key)])
    worker = Errands()
    await asyncio.wait_for(ExecutorLoop(store, [worker], clock=ManualClock()).run_until_idle(),
                           30)
    assert worker.runs == [(1, 1)]
    assert (await _kinds(store, effect.key))[-2:] == ["effect-executing", "effect-acked"]


async def test_an_effect_retried_after_a_note_runs_again(store: SqliteEventStore) -> None:
    (effect,) = (await store.append([effect_draft(Errand(n=1), "agent")])).events
    worker = Errands()
    worker.fail = True
    loop = ExecutorLoop(store, [worker], clock=ManualClock())
    await loop.run_until_idle()  # fails for good at its one attempt
    await store.append([note(effect.key)])
    await retry_effect(store, effect.key, reason="again")
    await store.append([note(effect.key)])
    worker.fail = False
    await asyncio.wait_for(loop.run_until_idle(), 30)
    assert worker.runs == [(1, 1), (1, 2)]
    assert (await _kinds(store, effect.key))[-1] == "effect-acked"
