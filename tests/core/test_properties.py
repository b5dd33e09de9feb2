"""Invariants checked over generated histories (hypothesis)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_core import (
    Backoff,
    Effect,
    Event,
    EventDraft,
    EventStore,
    ExecutionContext,
    Executor,
    ExecutorLoop,
    IdempotencyConflict,
    ManualClock,
    Projection,
    Projector,
    SqliteEventStore,
    VersionConflict,
    effect_draft,
)
from pulse_core._executor_loop import READ_BACKOFF
from pulse_core._projector import INLINE_FOLD

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
KEYS = st.sampled_from(["a", "b", "c", "d"])
KINDS = st.sampled_from(["tick", "error", "effect-acked"])


class Ledger(Projection[dict[str, list[int]]]):
    """Order-sensitive: per key, the seqs seen, plus a running checksum."""

    name = "ledger"

    def initial(self) -> dict[str, list[int]]:
        return {}

    def apply(self, state: dict[str, list[int]], event: Event) -> dict[str, list[int]]:
        seen = state.get(event.key, [])
        checksum = state.get("#", [0])[0]
        return {**state, event.key: [*seen, event.seq],
                "#": [(checksum * 31 + event.seq * len(event.kind)) % 1_000_003]}


class ErrorsOnly(Projection[int]):
    name = "errors-only"
    kinds = frozenset({"error"})

    def initial(self) -> int:
        return 0

    def apply(self, state: int, event: Event) -> int:
        return state + int(event.data["n"])


class ErrorsOnlyV2(ErrorsOnly):
    """The same projection name with a new meaning: a checkpoint of version 1 is stale."""

    version = 2

    def apply(self, state: int, event: Event) -> int:
        return state + 10 * int(event.data["n"])


Opener = Callable[[Path], Awaitable[EventStore]]
"""Opens a fresh store for one example (`folder` is the example's own temporary folder)."""


async def _open(folder: Path) -> SqliteEventStore:
    return await SqliteEventStore.open(folder / "events.db", synchronous="OFF")


step = st.one_of(
    st.lists(st.tuples(KEYS, KINDS, st.integers(0, 9)), min_size=1, max_size=6).map(
        lambda batch: ("append", batch)),
    st.just(("catch_up", None)),
    st.just(("restart", None)),
)


@SETTINGS
@given(steps=st.lists(step, max_size=25), every=st.integers(1, 7))
def test_incremental_projection_with_checkpoints_and_restarts_equals_replay(
    steps: list[tuple[str, Any]], every: int
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(projection_scenario(_open, Path(folder), steps, every))


async def projection_scenario(open_store: Opener, folder: Path, steps: list[tuple[str, Any]],
                              every: int) -> None:
    """Folding with checkpoints, restarts and catch-ups equals one replay of the log."""
    store = await open_store(folder)
    ckpt = folder / "ckpt"
    projector = Projector(store, [Ledger(), ErrorsOnly()], checkpoints=ckpt,
                          checkpoint_every=every, page=3)
    for action, batch in steps:
        if action == "append":
            await store.append([EventDraft(kind, key, {"n": n}) for key, kind, n in batch])
        elif action == "catch_up":
            await projector.catch_up()
        else:
            await projector.checkpoint()
            projector = Projector(store, [Ledger(), ErrorsOnly()], checkpoints=ckpt,
                                  checkpoint_every=every, page=3)
    incremental = await projector.catch_up()
    replay = await Projector(store, [Ledger(), ErrorsOnly()]).catch_up()
    assert incremental == replay
    await store.close()


@SETTINGS
@given(scripts=st.lists(st.lists(st.lists(KEYS, min_size=1, max_size=5), max_size=6),
                        min_size=1, max_size=8),
       pauses=st.lists(st.integers(0, 2), min_size=1, max_size=10))
def test_any_interleaving_of_appends_gives_gap_free_seq_and_versions(
    scripts: list[list[list[str]]], pauses: list[int]
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(interleaving_scenario(_open, Path(folder), scripts, pauses))


async def interleaving_scenario(open_store: Opener, folder: Path,
                                scripts: list[list[list[str]]], pauses: list[int]) -> None:
    """Appenders interleaved any way give gap-free seq, per-key versions, contiguous appends."""
    async def appender(store: EventStore, script: list[list[str]], who: int) -> list[Any]:
        results = []
        for i, keys in enumerate(script):
            for _ in range(pauses[(who + i) % len(pauses)]):
                await asyncio.sleep(0)
            results.append(await store.append([EventDraft("tick", k, {"w": who}) for k in keys]))
        return results

    store = await open_store(folder)
    per_appender = await asyncio.gather(
        *[appender(store, s, i) for i, s in enumerate(scripts)])
    events = await store.read()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len(events) == sum(len(b) for s in scripts for b in s)
    versions: dict[str, int] = {}
    for event in events:
        versions[event.key] = versions.get(event.key, 0) + 1
        assert event.version == versions[event.key]
    for results in per_appender:
        for result in results:  # each append's events are contiguous and share a tx
            seqs = [e.seq for e in result.events]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            assert {e.tx for e in events if e.seq in seqs} == {result.tx}
    await store.close()


@SETTINGS
@given(requests=st.lists(st.tuples(st.sampled_from(["r1", "r2", "r3"]), KEYS,
                                   st.integers(0, 2), st.booleans()), min_size=1, max_size=20))
def test_idempotency_replays_or_conflicts_exactly_as_the_first_write_decides(
    requests: list[tuple[str, str, int, bool]]
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(idempotency_scenario(_open, Path(folder), requests))


async def idempotency_scenario(open_store: Opener, folder: Path,
                               requests: list[tuple[str, str, int, bool]]) -> None:
    """Each idempotency key replays or conflicts exactly as its first write decides."""
    store = await open_store(folder)
    first: dict[str, tuple[str, int]] = {}
    before: list[Event] = []
    for idem, key, n, guarded in requests:
        expect = {key: await store.head(key)} if guarded else None
        try:
            result = await store.append([EventDraft("tick", key, {"n": n}, idem=idem)],
                                        expect=expect)
        except IdempotencyConflict:
            assert idem in first and first[idem] != (key, n)
        except VersionConflict:
            raise AssertionError("a fresh head cannot conflict") from None
        else:
            if idem in first:
                assert result.replayed and first[idem] == (key, n)
            else:
                assert not result.replayed
                first[idem] = (key, n)
        after = await store.read()
        assert after[: len(before)] == before  # append-only: the past never changes
        before = after
    assert sorted(e.idem for e in before if e.idem) == sorted(first)
    await store.close()


class Job(Effect, tag="prop-job"):
    n: int


class FlakyExecutor(Executor):
    handles = (Job,)
    max_attempts = 3
    backoff = Backoff(initial_ms=100, factor=2.0, max_ms=1_000, jitter=0.0)
    timeout = 5.0

    def __init__(self, failures: dict[int, int]) -> None:
        self.failures = failures
        self.runs: list[tuple[str, int]] = []

    async def execute(self, effect: Job, ctx: ExecutionContext) -> int:
        self.runs.append((ctx.effect_id, ctx.attempt))
        if ctx.attempt <= self.failures.get(effect.n, 0):
            raise RuntimeError(f"job {effect.n} fails attempt {ctx.attempt}")
        return effect.n


@SETTINGS
@given(failures=st.lists(st.integers(0, 4), min_size=1, max_size=12),
       loops=st.integers(1, 3))
def test_no_effect_attempt_is_executed_twice(failures: list[int], loops: int) -> None:
    async def scenario(folder: Path) -> None:
        store = await _open(folder)
        clock = ManualClock()
        executor = FlakyExecutor(dict(enumerate(failures)))
        runners = [ExecutorLoop(store, [executor], clock=clock) for _ in range(loops)]
        await store.append([effect_draft(Job(n=i), origin="agent") for i in range(len(failures))])
        async def outcomes() -> tuple[set[str], set[str]]:
            acked = {e.key for e in await store.read(kinds=["effect-acked"])}
            final = {e.key for e in await store.read(kinds=["effect-failed"])
                     if e.data["final"]}
            return acked, final

        for _ in range(200):  # bounds a hang only
            ran = len(executor.runs)
            await asyncio.gather(*[r.run_until_idle() for r in runners])
            acked, final = await outcomes()
            if len(acked | final) == len(failures):
                break
            if len(executor.runs) == ran:
                # nothing was due but a claim lost to another runner, which is tried again
                # after READ_BACKOFF on the loop's own clock (run_until_idle leaves it)
                await asyncio.sleep(READ_BACKOFF.initial_ms / 1000)
            clock.advance(2_000)  # past every retry's backoff
        assert len(executor.runs) == len(set(executor.runs))
        assert not acked & final
        assert len(acked) + len(final) == len(failures)
        assert len(acked) == sum(1 for f in failures if f < 3)
        assert all(attempt <= 3 for _, attempt in executor.runs)
        await store.close()

    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder)))


def test_pages_folded_in_a_thread_and_on_the_loop_give_the_same_states() -> None:
    async def scenario(folder: Path) -> None:
        store = await _open(folder)
        await store.append([EventDraft("error" if i % 3 else "tick", f"k{i % 7}", {"n": i})
                            for i in range(INLINE_FOLD * 4 + 5)])
        states = [await Projector(store, [Ledger(), ErrorsOnly()], page=page).catch_up()
                  for page in (INLINE_FOLD // 2, INLINE_FOLD + 1, INLINE_FOLD * 10)]
        assert states[0] == states[1] == states[2]
        assert states[0]["errors-only"] == sum(i for i in range(INLINE_FOLD * 4 + 5) if i % 3)
        await store.close()

    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder)))


async def test_a_projection_added_beside_a_checkpointed_one_applies_each_event_once(
    tmp_path: Path,
) -> None:
    store = await _open(tmp_path)
    ckpt = tmp_path / "ckpt"
    await store.append([EventDraft("error", f"k{n}", {"n": n}) for n in range(1, 6)])
    first = Projector(store, [ErrorsOnly()], checkpoints=ckpt)
    await first.catch_up()
    await first.checkpoint()
    await store.append([EventDraft("error", "k", {"n": 100})])
    # Ledger starts at seq 0 and ErrorsOnly at its checkpoint: one read serves both.
    incremental = await Projector(store, [ErrorsOnly(), Ledger()], checkpoints=ckpt).catch_up()
    replay = await Projector(store, [ErrorsOnly(), Ledger()]).catch_up()
    assert incremental == replay and incremental["errors-only"] == 115
    await store.close()


async def test_a_checkpoint_of_an_older_projection_version_is_rebuilt(tmp_path: Path) -> None:
    store = await _open(tmp_path)
    ckpt = tmp_path / "ckpt"
    await store.append([EventDraft("error", f"k{n}", {"n": n}) for n in range(1, 4)])
    old = Projector(store, [ErrorsOnly()], checkpoints=ckpt)
    assert (await old.catch_up())["errors-only"] == 6
    await old.checkpoint()
    await store.append([EventDraft("error", "k", {"n": 4})])
    states = await Projector(store, [ErrorsOnlyV2()], checkpoints=ckpt).catch_up()
    assert states["errors-only"] == 100
    await store.close()
