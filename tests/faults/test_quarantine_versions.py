"""A quarantined row must not freeze its key: the folds that write with expected versions
(the executor loop's index, TaskBoard, the memory folds) follow the key past the row."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pulse_core import (
    Effect,
    Engine,
    EventDraft,
    EventStore,
    ExecutionContext,
    Executor,
    ExecutorLoop,
    ManualClock,
    Projector,
    SqliteEventStore,
    TaskBoard,
)
from pulse_core._effects import effect_draft
from pulse_core._events import QUARANTINED
from pulse_core.memory import Memory, MemoryBoard
from pulse_core.store import AppendResult, Page, SqliteRecorder

MARK = "QQcorruptQQ"


class Chore(Effect, tag="quarantine-chore"):
    n: int


class Chores(Executor):
    handles = (Chore,)

    def __init__(self) -> None:
        self.ran: list[tuple[int, int]] = []

    async def execute(self, effect: Chore, ctx: ExecutionContext) -> int:
        self.ran.append((effect.n, ctx.attempt))
        return effect.n


def corrupt(db: Path) -> None:
    """Break the JSON of the one row whose data holds MARK, in the file itself."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    raw = bytearray(db.read_bytes())
    assert raw.count(MARK.encode()) == 1
    raw[raw.index(MARK.encode())] = ord('"')
    db.write_bytes(bytes(raw))


async def _effect_with(home: Path, *later: tuple[str, dict[str, object]]) -> str:
    """Append a Chore effect and then `later` (kind, data) events on its key; its id."""
    store = await SqliteEventStore.open(home / "events.db")
    try:
        [effect] = (await store.append([effect_draft(Chore(n=7), origin="agent")])).events
        for version, (kind, data) in enumerate(later, start=1):
            await store.append([EventDraft(kind, effect.key, data, origin="executor:loop")],
                               expect={effect.key: version})
        return effect.key
    finally:
        await store.close()


async def _claims(engine: Engine, key: str) -> list[int]:
    return [e.data["attempt"] for e in await engine.events.read(key=key)
            if e.kind == "effect-executing"]


async def test_an_effect_whose_claim_is_quarantined_runs_and_nothing_spins(
    tmp_path: Path,
) -> None:
    """B1: with its claim row unreadable, the index was one version behind the key forever:
    every claim conflicted, the effect never ran, and the loop claimed thousands of times.
    The lost claim counts as an attempt (it may have run), so the next one is attempt 2."""
    home = tmp_path / "home"
    home.mkdir()
    key = await _effect_with(home, ("effect-executing", {
        "attempt": 1, "lease_until": 0, "owner": MARK, "pid": 0, "started": 0.0}))
    corrupt(home / "events.db")
    chores = Chores()
    async with Engine(home, executors=[chores], clock=ManualClock(10_000)) as engine:
        await engine.step()
        assert chores.ran == [(7, 2)]
        assert await _claims(engine, key) == [2]
        [ack] = await engine.events.read(key=key, kinds=["effect-acked"])
        assert ack.data["attempt"] == 2
        assert len(await engine.events.read(key=key)) == 4  # effect, quarantine, claim, ack


async def test_an_effect_whose_ack_is_quarantined_runs_again_once_its_lease_ends(
    tmp_path: Path,
) -> None:
    """B1: a lost ack left the effect unfinished and unclaimable; now it runs again after
    its lease, as after a crash (at least once)."""
    home = tmp_path / "home"
    home.mkdir()
    key = await _effect_with(
        home,
        ("effect-executing", {"attempt": 1, "lease_until": 5_000, "lease_ms": 4_000,
                              "owner": "gone:1:x", "pid": 0, "started": 0.0}),
        ("effect-acked", {"attempt": 1, "result": MARK, "duration_ms": 1}))
    corrupt(home / "events.db")
    chores = Chores()
    clock = ManualClock(1_000)
    async with Engine(home, executors=[chores], clock=clock) as engine:
        await engine.step()
        assert chores.ran == []  # the lease still holds
        clock.advance(10_000)
        await engine.step()
        assert chores.ran == [(7, 2)]
        assert await _claims(engine, key) == [1, 2]


async def test_run_until_idle_claims_each_attempt_once_while_a_slow_one_runs(
    tmp_path: Path,
) -> None:
    """B3: after one attempt finished, run_until_idle dispatched against a stale index and
    claimed the finished effect again and again (thousands of conflicting appends) for as
    long as a slower attempt ran."""
    class Mixed(Executor):
        handles = (Chore,)

        async def execute(self, effect: Chore, ctx: ExecutionContext) -> int:
            await asyncio.sleep(0.5 if effect.n == 1 else 0.0)
            return effect.n

    class Counting(EventStore):
        """The real store, counting the appends asked of it (refused ones included)."""

        asked = 0

        async def append(self, drafts: Sequence[EventDraft],
                         expect: Mapping[str, int] | None = None) -> AppendResult:
            self.asked += 1
            return await super().append(drafts, expect)

    opened = await SqliteEventStore.open(tmp_path / "events.db")
    store = Counting(opened.recorder)
    try:
        await store.append([effect_draft(Chore(n=n), origin="agent") for n in (1, 2)])
        before = await store.last_seq()
        store.asked = 0
        await ExecutorLoop(store, [Mixed()]).run_until_idle()
        after = await store.read(before)
    finally:
        await opened.close()
    assert sorted(e.kind for e in after) == ["effect-acked"] * 2 + ["effect-executing"] * 2
    assert store.asked == 4, f"{store.asked} appends asked for 2 claims and 2 acks"


async def test_a_task_whose_assignment_is_quarantined_can_still_be_moved(
    tmp_path: Path,
) -> None:
    """B1: with one of its rows unreadable, every TaskBoard move raised VersionConflict."""
    db = tmp_path / "events.db"
    store = await SqliteEventStore.open(db)
    board = TaskBoard(store)
    await board.create("t-1", "write the report")
    await board.assign("t-1", MARK)
    await store.close()
    corrupt(db)
    store = await SqliteEventStore.open(db)
    try:
        board = TaskBoard(store)
        await store.read()  # meets the row: quarantined
        state = await board.state("t-1")
        assert state is not None and state.status == "pending"  # as the readable rows say
        assert state.version == await store.head("t-1")
        await board.assign("t-1", "ada")
        await board.start("t-1")
        state = await board.state("t-1")
        assert state is not None and (state.status, state.agent) == ("executing", "ada")
    finally:
        await store.close()


async def test_the_memory_fold_follows_an_identity_past_a_quarantined_row(
    tmp_path: Path,
) -> None:
    """B1: the memory fold's version (what the reviewer settles against) stayed behind the
    identity's key after one of its rows was quarantined."""
    db = tmp_path / "events.db"
    store = await SqliteEventStore.open(db)
    board = MemoryBoard(store)
    await board.set_state("ada", "mood", "calm")
    await board.set_state("ada", "plan", MARK)
    await store.close()
    corrupt(db)
    store = await SqliteEventStore.open(db)
    try:
        projector = Projector(store, [Memory()])
        await projector.catch_up()  # meets the row: quarantined
        states = await projector.catch_up()
        memory = states["memory"].get("ada")
        assert memory is not None and memory.version == await store.head("identity:ada") == 3
        assert "mood" in str(memory.state) and "plan" not in str(memory.state)
    finally:
        await store.close()


class MeetAtTheCheck(SqliteRecorder):
    """A real recorder whose first look for a row's quarantine record waits at `barrier`
    until the other store has looked too: two processes meet one bad row at once."""

    barrier: asyncio.Barrier | None = None

    async def select(self, *args: Any, **kwargs: Any) -> Page:
        page = await super().select(*args, **kwargs)
        if self.barrier is not None and kwargs.get("kinds") == [QUARANTINED]:
            barrier, self.barrier = self.barrier, None
            await barrier.wait()
        return page


async def test_two_stores_that_meet_one_bad_row_at_once_record_one_quarantine(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"
    store = await SqliteEventStore.open(db)
    (bad,) = (await store.append([EventDraft("effect", "e-1", {"effect": MARK},
                                             origin="agent")])).events
    await store.close()
    corrupt(db)
    barrier = asyncio.Barrier(2)
    recorders = [await MeetAtTheCheck.open(db) for _ in range(2)]
    stores = [EventStore(recorder) for recorder in recorders]
    try:
        for recorder in recorders:
            recorder.barrier = barrier
        first, second = await asyncio.wait_for(asyncio.gather(
            *(s.quarantine(bad.seq, "bad row") for s in stores)), 30)
        assert first.seq == second.seq
        records = await stores[0].read(kinds=[QUARANTINED])
        assert [(r.key, r.data["seq"]) for r in records] == [("e-1", bad.seq)]
    finally:
        for s in stores:
            await s.close()
