"""Hosts running different layers on one log: each engine announces the effect types its
host runs as it opens (`executors-announced`), and a host without an executor for an effect
leaves it to a host that announced one, also after an operator's retry; an effect no host
runs is failed for good, naming its type and what each host runs."""

from __future__ import annotations

from pathlib import Path

from pulse_core import (
    Effect,
    Engine,
    ExecutionContext,
    Executor,
    SqliteEventStore,
    retry_effect,
)
from pulse_core._effects import effect_draft


class Chore(Effect, tag="hosts-chore"):
    n: int


class Cycle(Effect, tag="hosts-cycle"):
    """What only host-b's layers run (as `maintenance-cycle` is the maintenance layer's)."""

    n: int


class Orphan(Effect, tag="hosts-orphan"):
    n: int


class Chores(Executor):
    handles = (Chore,)

    async def execute(self, effect: Chore, ctx: ExecutionContext) -> int:
        return effect.n


class Cycles(Executor):
    handles = (Cycle,)
    max_attempts = 1

    def __init__(self) -> None:
        self.runs: list[tuple[int, int]] = []
        self.fail = False

    async def execute(self, effect: Cycle, ctx: ExecutionContext) -> int:
        self.runs.append((effect.n, ctx.attempt))
        if self.fail:
            raise ConnectionError("the cycle's backend is down")
        return effect.n



async def _kinds(engine: Engine, key: str) -> list[str]:
    return [e.kind for e in await engine.events.read(key=key)]


async def test_a_host_without_an_executor_leaves_the_effect_to_the_host_that_runs_it(
        tmp_path: Path, store_url: str) -> None:
    cycles = Cycles()
    a = Engine(tmp_path / "a", store=store_url, host="host-a", executors=[Chores()])
    b = Engine(tmp_path / "b", store=store_url, host="host-b", executors=[cycles])
    await a.open()
    await b.open()  # opened, not started: only the calls below claim
    try:
        (effect,) = (await a.append([effect_draft(Cycle(n=1), "agent")])).events
        await a.executor_loop.run_until_idle()  # host-a sees it first, and must leave it
        assert await _kinds(a, effect.key) == ["effect"]
        await b.executor_loop.run_until_idle()
        assert await _kinds(a, effect.key) == ["effect", "effect-executing", "effect-acked"]

        cycles.fail = True  # fails for good at its one attempt; then an operator retries
        (again,) = (await a.append([effect_draft(Cycle(n=2), "agent")])).events
        await b.executor_loop.run_until_idle()
        cycles.fail = False
        await retry_effect(a.events, again.key, reason="backend is back")
        await a.executor_loop.run_until_idle()
        assert (await _kinds(a, again.key))[-1] == "effect-retried"  # left to host-b again
        await b.executor_loop.run_until_idle()
        assert cycles.runs == [(1, 1), (2, 1), (2, 2)]
        assert (await _kinds(a, again.key))[-1] == "effect-acked"
        announced = {e.data["host"]: set(e.data["tags"])
                     for e in await a.events.read(kinds=["executors-announced"])}
        assert set(announced) == {"host-a", "host-b"}  # the survival layer's tags beside
        assert "hosts-chore" in announced["host-a"] - announced["host-b"]
        assert "hosts-cycle" in announced["host-b"] - announced["host-a"]
    finally:
        await b.close()
        await a.close()


async def test_an_effect_no_host_runs_fails_for_good_naming_what_each_host_runs(
        tmp_path: Path, store_url: str) -> None:
    a = Engine(tmp_path / "a", store=store_url, host="host-a", executors=[Chores()])
    b = Engine(tmp_path / "b", store=store_url, host="host-b", executors=[Cycles()])
    await a.open()
    await b.open()
    try:
        orphan, bound = (await a.append([
            effect_draft(Orphan(n=1), "agent"),
            effect_draft(Cycle(n=2), "engine:tick", host="host-a")])).events
        await a.executor_loop.run_until_idle()
        for effect, bound_to in ((orphan, ""), (bound, " (bound to host host-a)")):
            (failed,) = await a.events.read(kinds=["effect-failed"], key=effect.key)
            tag = effect.data["effect"]["type"]
            error = failed.data["error"]
            assert failed.data["final"]
            assert error.startswith(f"no executor handles effect {tag!r}{bound_to} on any "
                                    "host of this log: host-a runs ")
            assert "hosts announced: host-a: " in error and "; host-b: " in error
            assert "hosts-chore" in error and "hosts-cycle" in error
            assert f"then `upulse effects retry {effect.key}`" in error
    finally:
        await b.close()
        await a.close()


async def test_a_hosts_latest_announcement_is_the_one_that_counts(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'shared-events.db'}"
    b = Engine(tmp_path / "b", store=url, host="host-b", executors=[Cycles()])
    await b.open()
    await b.close()  # host-b ran cycles once, then came back without that layer
    b = Engine(tmp_path / "b", store=url, host="host-b", executors=[])
    a = Engine(tmp_path / "a", store=url, host="host-a", executors=[Chores()])
    await b.open()
    await a.open()
    try:
        (effect,) = (await a.append([effect_draft(Cycle(n=1), "agent")])).events
        await a.executor_loop.run_until_idle()
        (failed,) = await a.events.read(kinds=["effect-failed"], key=effect.key)
        error = failed.data["error"]
        host_b_runs = error.split("host-b: ", 1)[1].split(" — ", 1)[0]
        assert failed.data["final"] and "hosts-cycle" not in host_b_runs
    finally:
        await a.close()
        await b.close()


async def test_a_store_without_announcements_fails_an_unhandled_effect_as_before(
        tmp_path: Path) -> None:
    from pulse_core import ExecutorLoop

    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        (effect,) = (await store.append([effect_draft(Orphan(n=1), "agent")])).events
        await ExecutorLoop(store, [Chores()], host="solo").run_until_idle()
        (failed,) = await store.read(kinds=["effect-failed"], key=effect.key)
        assert failed.data["final"] and "hosts announced: none" in failed.data["error"]
    finally:
        await store.close()
