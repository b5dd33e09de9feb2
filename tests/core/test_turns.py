"""Turns: one first choice per effect among the executor loops sharing a log, so a fleet
makes about one claim per effect instead of one per loop; a first choice that does not
claim in time (busy or gone) is passed over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulse_core import (
    Effect,
    EventStore,
    ExecutionContext,
    Executor,
    ExecutorLoop,
    ManualClock,
    SqliteEventStore,
)
from pulse_core._effects import EffectEntry, EffectStatus, effect_draft
from pulse_core._supervisor import wait_signal
from pulse_core._turns import Turns
from tests.timing import scaled

TAG = "turn-job"


def pending(effect_id: str, version: int = 1, tag: str = TAG) -> EffectEntry:
    return EffectEntry(effect_id, 1, {"effect": {"type": tag}}, version, EffectStatus.PENDING)


owners = st.lists(st.text("abcdef0123", min_size=1, max_size=6), min_size=1, max_size=8,
                  unique=True)


@given(owners, st.text(min_size=1, max_size=20))
def test_loops_that_see_the_same_claimers_agree_on_one_first_choice(
        names: list[str], effect_id: str) -> None:
    loops = [Turns(name) for name in names]
    for turns in loops:
        for name in names:
            turns.seen(TAG, name, 0.0)
    firsts = {turns.first_choice(TAG, effect_id, 1.0) for turns in loops}
    assert len(firsts) == 1 and firsts <= set(names)
    assert [turns.mine(pending(effect_id), 1.0) for turns in loops].count(True) == 1


def test_a_loop_that_saw_no_other_claimer_never_waits() -> None:
    turns = Turns("a")
    assert all(turns.mine(pending(f"e-{n}"), 0.0) for n in range(50))
    turns.seen(TAG, "a", 0.0)  # its own claims
    assert all(turns.mine(pending(f"f-{n}"), 0.0) for n in range(50))
    turns.seen("other-type", "b", 0.0)  # a claimer of another type only
    assert all(turns.mine(pending(f"g-{n}"), 0.0) for n in range(50))
    assert turns.next_s(0.0) is None


def test_effects_spread_over_the_claimers_and_a_new_one_moves_only_its_share() -> None:
    ids = [f"effect-{n}" for n in range(3_000)]
    turns = Turns("a")
    for name in ("a", "b", "c"):
        turns.seen(TAG, name, 0.0)
    before = {i: turns.first_choice(TAG, i, 0.0) for i in ids}
    shares = {name: list(before.values()).count(name) for name in "abc"}
    assert all(800 < share < 1_200 for share in shares.values()), shares
    turns.seen(TAG, "d", 0.0)
    after = {i: turns.first_choice(TAG, i, 0.0) for i in ids}
    moved = [i for i in ids if after[i] != before[i]]
    assert all(after[i] == "d" for i in moved)  # none moved between the loops that stayed
    assert 500 < len(moved) < 1_000


def test_an_effect_left_to_its_first_choice_is_taken_after_the_wait_and_that_loop_passed_over(
        ) -> None:
    turns = Turns("a", wait_s=0.05)
    turns.seen(TAG, "b", 0.0)
    theirs = next(e for e in (f"e-{n}" for n in range(100))
                  if turns.first_choice(TAG, e, 0.0) == "b")
    assert not turns.mine(pending(theirs), 1.0)
    assert turns.next_s(1.0) == pytest.approx(0.05)
    assert not turns.mine(pending(theirs), 1.04)
    assert turns.mine(pending(theirs), 1.05)  # b did not claim it in time
    # b is passed over now: its other effects are a's at once, until b claims again
    others = [e for e in (f"f-{n}" for n in range(100))]
    assert all(turns.mine(pending(e), 1.06) for e in others)
    turns.seen(TAG, "b", 1.07)
    assert not all(turns.mine(pending(e, version=2), 1.08) for e in others)


def test_a_claimer_not_seen_for_the_window_is_no_first_choice() -> None:
    turns = Turns("a", window_s=60.0)
    turns.seen(TAG, "b", 0.0)
    ids = [f"e-{n}" for n in range(100)]
    assert {turns.first_choice(TAG, i, 59.0) for i in ids} == {"a", "b"}
    assert {turns.first_choice(TAG, i, 60.5) for i in ids} == {"a"}


def test_a_wait_ends_with_its_effect_claimed_or_moved_on() -> None:
    turns = Turns("a", wait_s=0.05)
    turns.seen(TAG, "b", 0.0)
    theirs = [e for e in (f"e-{n}" for n in range(40)) if turns.first_choice(TAG, e, 0.0) == "b"]
    for effect_id in theirs:
        assert not turns.mine(pending(effect_id), 0.0)
    claimed = {e: EffectEntry(e, 1, {}, 2, EffectStatus.EXECUTING) for e in theirs[:2]}
    turns.keep({**claimed, **{e: pending(e) for e in theirs[2:]}}, 0.0)
    turns.keep({e: pending(e) for e in theirs[2:]}, 0.0)
    assert turns.next_s(0.0) == pytest.approx(0.05)
    turns.keep({}, 0.0)
    assert turns.next_s(0.0) is None


# -- two loops on one log ---------------------------------------------------------------------


class Job(Effect, tag=TAG):
    n: int


class Doer(Executor):
    handles = (Job,)
    timeout = 5.0

    def __init__(self) -> None:
        self.done: list[int] = []

    async def execute(self, effect: Job, ctx: ExecutionContext) -> object:
        self.done.append(effect.n)
        return None


class CountingClaims:
    """The store a loop is given, recording the effect of each claim it tries (each append
    of `effect-executing`, whether it wins or not); everything else is the real store's."""

    def __init__(self, store: SqliteEventStore) -> None:
        self._store = store
        self.claimed: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def append(self, drafts: Any, expect: Any = None) -> Any:
        if drafts and drafts[0].kind == "effect-executing":
            self.claimed.append(drafts[0].key)
        return await self._store.append(drafts, expect)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    store = await SqliteEventStore.open(tmp_path / "events.db", synchronous="NORMAL")
    yield store
    await store.close()


async def _run(store: EventStore, *loops: ExecutorLoop) -> list[asyncio.Task[None]]:
    return [asyncio.create_task(loop.run()) for loop in loops]


async def _acked(store: EventStore, count: int, within: float = 30.0) -> None:
    """Wait until `count` effects are acked, looking again after each commit."""
    signal = store.subscribe()
    try:
        async with asyncio.timeout(scaled(within)):
            while len(await store.read(kinds=["effect-acked"])) < count:
                await wait_signal(signal, 0.05)
                signal.clear()
    finally:
        store.unsubscribe(signal)


async def test_two_loops_that_have_seen_each_other_claim_each_effect_once(
        store: SqliteEventStore) -> None:
    views = [CountingClaims(store), CountingClaims(store)]
    doers = [Doer(), Doer()]
    loops = [ExecutorLoop(view, [doer], scan_interval=0.2)  # type: ignore[arg-type]
             for view, doer in zip(views, doers, strict=True)]
    for loop in loops:  # a first choice late by more than the 50 ms wait on a busy machine
        loop._turns.wait_s = scaled(10)  # is passed over (tested apart): not what this counts
    tasks = await _run(store, *loops)
    try:
        # until each loop has claimed something, each takes every effect it sees
        n = 0
        while not all(doer.done for doer in doers):
            await store.append([effect_draft(Job(n=n), origin="agent")])
            n += 1
            await _acked(store, n)
            assert n < 200, "one loop never claimed anything"
        measured: set[str] = set()
        for m in range(n, n + 60):  # one at a time: each lands on two idle loops
            measured.update(e.key for e in (await store.append(
                [effect_draft(Job(n=m), origin="agent")])).events)
            await _acked(store, m + 1)
        # the claims of these effects only: a loop that read the log before the last
        # warm-up effect was claimed may still try it (and be refused) after it was acked
        tried = sum(key in measured for view in views for key in view.claimed)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    done = sorted(doers[0].done + doers[1].done)
    assert done == list(range(n + 60))  # every effect ran once
    assert tried == 60  # one claim an effect: none lost to the other loop
    assert all(len([d for d in doer.done if d >= n]) > 5 for doer in doers)  # both work


def _counts(loop: ExecutorLoop, other: ExecutorLoop) -> bool:
    """Whether `loop` leaves some effects to `other` now."""
    now = asyncio.get_running_loop().time()
    return other.owner in {loop._turns.first_choice(TAG, f"e-{n}", now) for n in range(64)}


async def test_effects_whose_first_choice_stopped_are_taken_when_the_wait_ends(
        store: SqliteEventStore) -> None:
    doers = [Doer(), Doer()]
    # reads only on a commit of this store, or when a wait falls due: never on a scan
    loops = [ExecutorLoop(store, [doer], scan_interval=600.0) for doer in doers]
    tasks = await _run(store, *loops)
    n = 0
    try:
        # until the second loop counts the first as a claimer (a loop passed over, once
        # busy, is counted again when it claims again)
        while not _counts(loops[1], loops[0]):
            await store.append([effect_draft(Job(n=n), origin="agent")])
            n += 1
            await _acked(store, n)
            assert n < 500, "the second loop never saw the first claim anything"
        tasks[0].cancel()  # the first loop stops
        await asyncio.gather(tasks[0], return_exceptions=True)
        # only effects whose turn is the stopped loop's: no commit of the running loop's
        # own wakes it before the wait ends, so it claims them on the wait's timer alone
        now = asyncio.get_running_loop().time()
        drafts: list[Any] = []
        while len(drafts) < 20:
            draft = effect_draft(Job(n=n + len(drafts)), origin="agent")
            if loops[1]._turns.first_choice(TAG, draft.key, now) == loops[0].owner:
                drafts.append(draft)
        await store.append(drafts)
        await _acked(store, n + 20, within=60.0)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert sorted(doers[1].done[-20:]) == list(range(n, n + 20))
    assert loops[1]._turns.waiting == 0  # every wait ended with its effect claimed


async def test_claims_read_back_from_long_ago_make_no_first_choice(
        store: SqliteEventStore) -> None:
    earlier = ExecutorLoop(store, [Doer()])  # a loop that ran before this start, and left
    await store.append([effect_draft(Job(n=n), origin="agent") for n in range(300)])
    await earlier.run_until_idle()  # 300 claims: a new loop folds them off the event loop
    now = asyncio.get_running_loop().time()
    ids = [f"e-{n}" for n in range(50)]

    later = ExecutorLoop(store, [Doer()], clock=ManualClock(int(time.time() * 1000) + 600_000))
    await later.refresh()  # ten minutes on: the earlier loop's claims are old news
    assert {later._turns.first_choice(TAG, i, now) for i in ids} == {later.owner}

    now_too = ExecutorLoop(store, [Doer()])
    await now_too.refresh()  # at once: the earlier loop may be running still
    assert {now_too._turns.first_choice(TAG, i, now) for i in ids} == {now_too.owner,
                                                                          earlier.owner}
    # an effect bound to this host is claimed at once whoever's turn it would be
    now_too._taking_turns = True
    theirs = [i for i in ids if now_too._turns.first_choice(TAG, i, now) == earlier.owner]
    assert not any(now_too._my_turn(pending(i)) for i in theirs)
    bound = [EffectEntry(i, 1, {"effect": {"type": TAG}, "host": now_too.host}, 1,
                         EffectStatus.PENDING) for i in theirs]
    assert all(now_too._my_turn(entry) for entry in bound)


class HeldReads:
    """The store a loop is given, whose reads of the log can be held after they read: a
    refresh that read before a claim committed, and folds after the attempt ended."""

    def __init__(self, store: SqliteEventStore) -> None:
        self._store = store
        self.read = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def pages(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        got = [page async for page in self._store.pages(*args, **kwargs)]
        self.read.set()
        await self.release.wait()
        for page in got:
            yield page


async def test_an_attempt_that_ended_during_a_read_is_not_claimed_again_from_that_read(
        store: SqliteEventStore) -> None:
    view = HeldReads(store)
    doer = Doer()
    loop = ExecutorLoop(view, [doer])  # type: ignore[arg-type]
    await store.append([effect_draft(Job(n=1), origin="agent")])
    await loop.refresh()
    view.release.clear()
    view.read.clear()
    reading = asyncio.create_task(loop.refresh())
    await view.read.wait()  # the refresh has read the log: the effect unclaimed
    assert loop.dispatch() == 1
    await _acked(store, 1)  # the attempt ran and ended meanwhile
    view.release.set()
    await reading  # folds what it read: the effect still pending, as far as it knows
    assert loop.dispatch() == 0  # a claim now would be refused: the effect was acked
    await loop.refresh()
    assert loop.unfinished == 0 and doer.done == [1]
