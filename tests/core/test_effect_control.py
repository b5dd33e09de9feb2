"""Cancel and retry: the fold, the executor loop's index, the loop, and the race with a claim."""

from __future__ import annotations

import asyncio
import re
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pulse_core._effect_control as effect_control
from pulse_core import (
    Backoff,
    Effect,
    EffectEntry,
    EffectNotFound,
    EffectStateConflict,
    EffectStatus,
    Event,
    EventDraft,
    EventStore,
    ExecutionContext,
    Executor,
    ExecutorLoop,
    InvalidEvent,
    ManualClock,
    SqliteEventStore,
    cancel_effect,
    fold_effect,
    retry_effect,
)
from pulse_core._attempts import claim_draft
from pulse_core._effect_index import EffectIndex
from pulse_core._effects import effect_draft
from pulse_core._lease import Owner
from pulse_core._projector import INLINE_FOLD
from pulse_survival import Notify, RestartProcess
from pulse_survival.ledger import SurvivalLedger


class Chore(Effect, tag="control-chore"):
    n: int
    fail_times: int = 0


class Chores(Executor):
    """Fails each chore's first `fail_times` attempts (counted over every attempt it ever
    had), then acks; attempts wait at `gate` while `hold` is set."""

    handles = (Chore,)
    timeout = 30.0
    max_attempts = 2
    backoff = Backoff(initial_ms=1_000, factor=1.0, max_ms=1_000, jitter=0.0)

    def __init__(self) -> None:
        self.runs: list[tuple[int, int, str]] = []
        self.hold = False
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def execute(self, effect: Chore, ctx: ExecutionContext) -> dict[str, int]:
        self.runs.append((effect.n, ctx.attempt, ctx.idempotency_key))
        self.entered.set()
        if self.hold:
            await self.gate.wait()
        if ctx.attempt <= effect.fail_times:
            raise ConnectionError(f"chore {effect.n}: attempt {ctx.attempt} failed")
        return {"n": effect.n}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    yield store
    await store.close()


async def record(store: EventStore, *chores: Chore) -> list[str]:
    result = await store.append([effect_draft(c, origin="agent") for c in chores])
    return [e.key for e in result.events]


async def entry_of(store: EventStore, effect_id: str) -> EffectEntry:
    entry: EffectEntry | None = None
    for event in await store.read(key=effect_id):
        entry = fold_effect(entry, event)
    assert entry is not None
    return entry


async def failed_for_good(store: SqliteEventStore, worker: Chores, *chores: Chore
                          ) -> list[str]:
    """Record `chores` (each failing at least twice) and run them until they fail for good."""
    clock = ManualClock()
    loop = ExecutorLoop(store, [worker], clock=clock)
    ids = await record(store, *chores)
    for _ in range(worker.max_attempts):
        await loop.run_until_idle()
        clock.advance(1_000)
    for effect_id in ids:
        assert (await entry_of(store, effect_id)).status is EffectStatus.FAILED
    return ids


# -- the fold ------------------------------------------------------------------------------


async def test_a_cancel_finishes_a_retrying_effect_and_keeps_its_last_error(
        store: SqliteEventStore) -> None:
    worker = Chores()
    loop = ExecutorLoop(store, [worker], clock=ManualClock())
    (effect_id,) = await record(store, Chore(n=1, fail_times=5))
    await loop.run_until_idle()  # attempt 1 fails: retrying in a second
    event = await cancel_effect(store, effect_id, reason="the disk is fine now")
    entry = await entry_of(store, effect_id)
    assert (entry.status, entry.finished, entry.retry_at, entry.attempt) == (
        EffectStatus.CANCELLED, True, 0, 1)
    assert entry.error == "ConnectionError: chore 1: attempt 1 failed"
    assert (event.kind, event.origin, event.data) == (
        "effect-cancelled", "human:operator", {"reason": "the disk is fine now",
                                               "was": "retrying"})
    assert event.cause == (await store.read(kinds=["effect"]))[0].seq


async def test_a_retry_makes_a_failed_effect_pending_with_its_attempts_counted_afresh(
        store: SqliteEventStore) -> None:
    (effect_id,) = await failed_for_good(store, Chores(), Chore(n=1, fail_times=2))
    event = await retry_effect(store, effect_id, reason="the server is back", origin="web")
    entry = await entry_of(store, effect_id)
    assert (entry.status, entry.finished, entry.attempt, entry.attempts_before_retry) == (
        EffectStatus.PENDING, False, 2, 2)
    assert (entry.owner, entry.owner_pid, entry.lease_until, entry.retry_at) == ("", 0, 0, 0)
    assert entry.error == "ConnectionError: chore 1: attempt 2 failed"  # remembered
    assert (event.kind, event.origin, event.data["was"]) == ("effect-retried", "human:web",
                                                             "failed")


# -- the executor loop ---------------------------------------------------------------------


async def test_the_executor_loop_never_runs_a_cancelled_effect(store: SqliteEventStore) -> None:
    clock = ManualClock()
    worker = Chores()
    loop = ExecutorLoop(store, [worker], clock=clock)
    retrying, _ = await record(store, Chore(n=1, fail_times=1), Chore(n=2, fail_times=1))
    await loop.run_until_idle()  # both fail attempt 1 and wait for a retry
    (pending,) = await record(store, Chore(n=3))
    for effect_id in (retrying, pending):
        await cancel_effect(store, effect_id, reason="not needed")
    for _ in range(3):
        clock.advance(1_000)
        await loop.run_until_idle()
    assert sorted((n, attempt) for n, attempt, _ in worker.runs) == [(1, 1), (2, 1), (2, 2)]
    assert loop.unfinished == 0
    assert [e.key for e in await store.read(kinds=["effect-executing"])].count(pending) == 0


async def test_a_retried_failed_effect_runs_to_ack_with_its_max_attempts_afresh(
        store: SqliteEventStore) -> None:
    clock = ManualClock()
    worker = Chores()
    (effect_id,) = await failed_for_good(store, worker, Chore(n=1, fail_times=3))
    loop = ExecutorLoop(store, [worker], clock=clock)
    await loop.refresh()
    assert loop.unfinished == 0  # failed for good: not in the index
    await retry_effect(store, effect_id, reason="try again")
    await loop.run_until_idle()  # attempt 3 fails, but only the first of this round
    entry = await entry_of(store, effect_id)
    assert (entry.status, entry.attempt) == (EffectStatus.RETRYING, 3)
    clock.advance(1_000)
    await loop.run_until_idle()
    assert (await entry_of(store, effect_id)).status is EffectStatus.ACKED
    assert [attempt for _, attempt, _ in worker.runs] == [1, 2, 3, 4]
    keys = [key for _, _, key in worker.runs]
    assert len(set(keys)) == 4  # attempt numbers, and the idempotency keys, never repeat


async def test_after_a_retry_the_backoff_starts_over(store: SqliteEventStore) -> None:
    class Doubling(Chores):
        backoff = Backoff(initial_ms=1_000, factor=2.0, max_ms=60_000, jitter=0.0)

    clock = ManualClock()
    worker = Doubling()
    (effect_id,) = await failed_for_good(store, worker, Chore(n=1, fail_times=3))
    loop = ExecutorLoop(store, [worker], clock=clock)
    await retry_effect(store, effect_id, reason="try again")
    await loop.run_until_idle()  # attempt 3, the first after the retry, fails
    entry = await entry_of(store, effect_id)
    assert entry.status is EffectStatus.RETRYING
    assert entry.retry_at - clock.now_ms() == worker.backoff.delay_ms(1) == 1_000


async def test_a_cancelled_effect_no_longer_holds_back_an_equal_one(
        store: SqliteEventStore) -> None:
    loop = ExecutorLoop(store, [Chores()], clock=ManualClock())
    (effect_id,) = await record(store, Chore(n=7))
    await loop.refresh()
    assert loop.pending_dedup_keys() == {Chore(n=7).dedup_key()}
    await cancel_effect(store, effect_id, reason="stale")
    await loop.refresh()
    assert loop.pending_dedup_keys() == frozenset()


# -- the index -----------------------------------------------------------------------------


@pytest.mark.parametrize("padding", [0, INLINE_FOLD + 1], ids=["inline", "in-a-thread"])
async def test_the_index_brings_back_a_retried_effect_it_had_dropped(
        store: SqliteEventStore, padding: int) -> None:
    (effect_id,) = await failed_for_good(store, Chores(), Chore(n=1, fail_times=2))
    index = EffectIndex(store, None)
    await index.refresh()
    assert index.entries == {}
    await record(store, *[Chore(n=100 + i) for i in range(padding)])
    retried = await retry_effect(store, effect_id, reason="again")
    await index.refresh()
    entry = index.entries[effect_id]
    assert (entry.status, entry.version, entry.attempts_before_retry) == (
        EffectStatus.PENDING, retried.version, 2)
    assert len(index.entries) == padding + 1


async def test_the_index_folds_a_finish_a_retry_and_a_claim_read_in_one_refresh(
        store: SqliteEventStore) -> None:
    """The retry's effect was unfinished at the last refresh: the failure, the retry and the
    next claim all arrive in one page."""
    index = EffectIndex(store, None)
    worker = Chores()
    loop = ExecutorLoop(store, [worker], clock=ManualClock())
    (effect_id,) = await record(store, Chore(n=1, fail_times=9))
    worker.max_attempts = 1
    await index.refresh()
    assert index.entries[effect_id].status is EffectStatus.PENDING
    await loop.run_until_idle()  # fails for good at attempt 1
    await retry_effect(store, effect_id, reason="again")
    entry = await entry_of(store, effect_id)
    owner = Owner.here("elsewhere")
    await store.append([claim_draft(entry, owner, 10**13, "executor:Chores")],
                       expect={effect_id: entry.version})
    await index.refresh()
    claimed = index.entries[effect_id]
    assert (claimed.status, claimed.attempt, claimed.owner) == (
        EffectStatus.EXECUTING, 2, owner.id)


async def test_a_reloaded_checkpoint_keeps_a_retried_effect_and_forgets_a_cancelled_one(
        store: SqliteEventStore, tmp_path: Path) -> None:
    clock = ManualClock()
    worker = Chores()
    (retried,) = await failed_for_good(store, worker, Chore(n=1, fail_times=3))
    (cancelled,) = await record(store, Chore(n=2))
    await retry_effect(store, retried, reason="again")
    await cancel_effect(store, cancelled, reason="not needed")
    first = ExecutorLoop(store, [worker], clock=clock, checkpoints=tmp_path / "ckpt")
    await first.refresh()
    await first.drain(0)  # saves the checkpoint
    second = ExecutorLoop(store, [worker], clock=clock, checkpoints=tmp_path / "ckpt")
    loaded = second._index  # as read from the checkpoint, before any refresh
    assert loaded.cursor == await store.last_seq()
    assert set(loaded.entries) == {retried}
    assert loaded.entries[retried].attempts_before_retry == 2
    await second.run_until_idle()  # attempt 3 fails, with a retry left in this round
    clock.advance(1_000)
    await second.run_until_idle()
    assert (await entry_of(store, retried)).status is EffectStatus.ACKED
    assert [n for n, _, _ in worker.runs].count(2) == 0


# -- refusals and the race with a claim ----------------------------------------------------


async def test_cancel_and_retry_of_an_unknown_id_name_it_and_where_ids_are_listed(
        store: SqliteEventStore) -> None:
    for control in (cancel_effect, retry_effect):
        with pytest.raises(EffectNotFound) as caught:
            await control(store, "e-404", reason="x")
        assert "'e-404'" in str(caught.value) and "`upulse effects`" in str(caught.value)
    no_id: Any = None
    with pytest.raises(EffectNotFound, match="None is not an effect id"):
        await cancel_effect(store, no_id, reason="x")
    assert await store.last_seq() == 0


async def test_refusals_name_the_state_and_what_to_do(store: SqliteEventStore) -> None:
    clock = ManualClock()
    worker = Chores()
    loop = ExecutorLoop(store, [worker], clock=clock)
    cancelled, acked, failed = await record(store, Chore(n=1, fail_times=9), Chore(n=2),
                                            Chore(n=3, fail_times=9))
    await loop.run_until_idle()  # 1 and 3 retrying, 2 acked
    await cancel_effect(store, cancelled, reason="x")
    clock.advance(1_000)
    await loop.run_until_idle()  # 3 failed for good
    cases = [
        (cancel_effect, acked, "acked", "is acked (attempt 1) — it ran already; cancel "
                                        "applies to pending or retrying effects"),
        (retry_effect, acked, "acked", "is acked (attempt 1) — it ran; record a new effect"),
        (cancel_effect, cancelled, "cancelled", "is cancelled already — nothing will run it; "
                                                f"`upulse effects retry {cancelled}` runs it"),
        (cancel_effect, failed, "failed", "failed for good (attempt 2: ConnectionError: chore "
                                          "3: attempt 2 failed) — nothing will run it"),
    ]
    before = await store.last_seq()
    for control, effect_id, status, expected in cases:
        with pytest.raises(EffectStateConflict) as caught:
            await control(store, effect_id, reason="x")
        assert f"effect {effect_id} {expected}" in str(caught.value)
        assert (caught.value.effect_id, caught.value.status) == (effect_id, status)
    assert await store.last_seq() == before  # a refusal writes nothing
    await retry_effect(store, failed, reason="x")
    with pytest.raises(EffectStateConflict, match=f"effect {failed} is pending — it runs as "
                       "soon as an executor loop claims it; retry applies to effects that "
                       "failed for good or were cancelled"):
        await retry_effect(store, failed, reason="x")


async def test_a_running_effect_cannot_be_cancelled_and_the_refusal_names_its_lease(
        store: SqliteEventStore) -> None:
    worker = Chores()
    worker.hold = True
    loop = ExecutorLoop(store, [worker])
    (effect_id,) = await record(store, Chore(n=1))
    running = asyncio.create_task(loop.run_until_idle())
    await asyncio.wait_for(worker.entered.wait(), 5)
    with pytest.raises(EffectStateConflict) as caught:
        await cancel_effect(store, effect_id, reason="too late")
    host, pid = socket.gethostname(), loop.owner.split(":")[-2]
    assert re.search(rf"effect {effect_id} is executing \(attempt 1, lease held by "
                     rf"{re.escape(host)}/{pid} until \d\d:\d\d:\d\d\) — wait for it to "
                     "finish; cancel applies to pending or retrying effects", str(caught.value))
    assert caught.value.status == "executing"
    worker.gate.set()
    await asyncio.wait_for(running, 5)
    assert (await entry_of(store, effect_id)).status is EffectStatus.ACKED


async def test_a_cancel_that_loses_the_race_to_a_claim_fails_cleanly(
        store: SqliteEventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cancel reads the effect pending; a claim commits before the cancel's append."""
    worker = Chores()
    worker.hold = True
    loop = ExecutorLoop(store, [worker])
    (effect_id,) = await record(store, Chore(n=1))
    read = effect_control.read_effect
    running: list[asyncio.Task[None]] = []

    async def read_then_claim(events: EventStore, key: str) -> EffectEntry:
        entry = await read(events, key)
        if not running:  # the first read only: the claim lands between it and the append
            running.append(asyncio.create_task(loop.run_until_idle()))
            await asyncio.wait_for(worker.entered.wait(), 5)
        return entry

    monkeypatch.setattr(effect_control, "read_effect", read_then_claim)
    with pytest.raises(EffectStateConflict, match="is executing"):
        await cancel_effect(store, effect_id, reason="too late")
    worker.gate.set()
    await asyncio.wait_for(running[0], 5)
    kinds = [e.kind for e in await store.read(key=effect_id)]
    assert kinds == ["effect", "effect-executing", "effect-acked"]


async def test_a_claim_that_loses_the_race_to_a_cancel_runs_nothing(
        store: SqliteEventStore) -> None:
    worker = Chores()
    loop = ExecutorLoop(store, [worker])
    (effect_id,) = await record(store, Chore(n=1))
    await loop.refresh()  # the loop judges it pending at version 1 ...
    await cancel_effect(store, effect_id, reason="not needed")
    assert loop.dispatch() == 1  # ... and claims at that version, which has moved on
    await asyncio.gather(*loop._inflight.values())
    assert worker.runs == []
    assert [e.kind for e in await store.read(key=effect_id)] == ["effect", "effect-cancelled"]
    await loop.refresh()
    assert loop.unfinished == 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loop_pauses=st.integers(0, 12), cancel_pauses=st.integers(0, 12))
def test_of_a_claim_and_a_cancel_interleaved_any_way_exactly_one_wins(
        loop_pauses: int, cancel_pauses: int) -> None:
    async def scenario(folder: Path) -> None:
        store = await SqliteEventStore.open(folder / "events.db")
        worker = Chores()
        loop = ExecutorLoop(store, [worker])
        (effect_id,) = await record(store, Chore(n=1))

        async def claim() -> None:
            for _ in range(loop_pauses):
                await asyncio.sleep(0)
            await loop.run_until_idle()

        async def cancel() -> Event | EffectStateConflict:
            for _ in range(cancel_pauses):
                await asyncio.sleep(0)
            try:
                return await cancel_effect(store, effect_id, reason="race")
            except EffectStateConflict as exc:
                return exc

        _, cancelled = await asyncio.gather(claim(), cancel())
        kinds = [e.kind for e in await store.read(key=effect_id)]
        if isinstance(cancelled, Event):
            assert kinds == ["effect", "effect-cancelled"] and worker.runs == []
        else:
            assert kinds == ["effect", "effect-executing", "effect-acked"]
            assert len(worker.runs) == 1 and cancelled.status in ("executing", "acked")
        await store.close()

    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder)))


# -- what is written -----------------------------------------------------------------------


async def test_a_bad_origin_or_reason_is_refused_and_nothing_is_written(
        store: SqliteEventStore) -> None:
    (effect_id,) = await record(store, Chore(n=1))
    with pytest.raises(InvalidEvent, match="origin 'an operator': name who asks in one word"):
        await cancel_effect(store, effect_id, reason="x", origin="an operator")
    bad_reason: Any = 42
    with pytest.raises(InvalidEvent, match="reason"):
        await cancel_effect(store, effect_id, reason=bad_reason)
    with pytest.raises(InvalidEvent, match="at most 1000 characters"):
        await cancel_effect(store, effect_id, reason="x" * 1_001)
    assert await store.last_seq() == 1


async def test_a_cancelled_survival_effect_leaves_the_failure_streak_as_it_was(
        store: SqliteEventStore) -> None:
    restart = RestartProcess(name="agent", argv=("agent",))
    first, second = [e.key for e in (await store.append([
        effect_draft(restart, origin="survival"),
        effect_draft(Notify(topic="t", level="info", text="x"), origin="survival")])).events]
    await store.append([effect_draft(RestartProcess(name="b", argv=("b",)), origin="survival")])
    third = (await store.read(kinds=["effect"]))[-1].key
    await store.append([EventDraft("effect-failed", first, {"attempt": 1, "error": "no",
                                                            "final": True}, origin="survival")])
    await cancel_effect(store, third, reason="not needed")
    ledger = SurvivalLedger()
    state = ledger.initial()
    for event in await store.read():
        state = ledger.apply(state, event)
    assert state.failure_streak == 1  # the failure counted; the cancel neither reset nor added
    assert set(state.open) == {second}  # the cancelled restart is no longer open
