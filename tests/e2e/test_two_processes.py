"""Two processes, each a bare ExecutorLoop over one events.db, share a stream of effects.

Claims are appends that expect the effect's version, so whichever process claims second
loses; each effect must run once, in one process, and be acked once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from pulse_core import SqliteEventStore
from pulse_core._effects import effect_draft

from .children.workload import Work, read_journal
from .support import (
    Child,
    assert_every_effect_finished_once,
    by_key,
    check_database,
    read_events,
    wait_until,
)

BATCHES = 6
BATCH = 50
TOTAL = BATCHES * BATCH


async def create(db: Path) -> None:
    """Create events.db before the loops start, so they do not race to create it."""
    store = await SqliteEventStore.open(db)
    await store.close()


async def feed(db: Path, loops: list[Child]) -> None:
    """Append TOTAL effects in batches while both loops run, then wait until all are acked."""
    store = await SqliteEventStore.open(db)
    try:
        for batch in range(BATCHES):
            await store.append([effect_draft(Work(n=batch * BATCH + i), origin="agent")
                                for i in range(BATCH)])
            await asyncio.sleep(0.1)

        def all_acked() -> bool:
            return len(read_events(db, {"effect-acked"})) >= TOTAL

        await asyncio.to_thread(wait_until, all_acked, 20, f"{TOTAL} acks", *loops)
    finally:
        await store.close()


@pytest.mark.slow
def test_two_executor_processes_run_each_effect_exactly_once(
    tmp_path: Path, spawn: Callable[..., Child]
) -> None:
    home, journal = tmp_path / "home", tmp_path / "journal.txt"
    home.mkdir()
    db = home / "events.db"
    asyncio.run(create(db))
    loops = [spawn("loop_child.py", home, journal) for _ in range(2)]
    for loop in loops:
        loop.wait_for_line("ready", 15)

    asyncio.run(feed(db, loops))
    for loop in loops:
        assert loop.stop() == 0, loop.describe()
        assert loop.lines()[-1] == "stopped 0", loop.describe()

    events = read_events(db)
    groups = by_key(events)
    effects = [e.key for e in events if e.kind == "effect"]
    assert len(effects) == TOTAL

    runs = [(int(pid), key, int(attempt)) for pid, key, attempt in read_journal(journal)]
    pairs = Counter((key, attempt) for _, key, attempt in runs)
    duplicated = [pair for pair, count in pairs.items() if count > 1]
    assert not duplicated, f"(effect id, attempt) run twice: {duplicated[:5]}"
    # No process died, so no lease was lost: each effect ran once, as attempt 1.
    per_effect = Counter(key for _, key, _ in runs)
    assert set(per_effect) == set(effects)
    assert set(per_effect.values()) == {1}, per_effect.most_common(3)
    assert {attempt for _, _, attempt in runs} == {1}

    # Acked exactly once, by the process that claimed and ran it.
    ran_in = {key: pid for pid, key, _ in runs}
    for key in effects:
        kinds = [e.kind for e in groups[key]]
        assert kinds == ["effect", "effect-executing", "effect-acked"], (key, kinds)
        claim, ack = groups[key][1], groups[key][2]
        assert claim.data["pid"] == ack.data["result"]["pid"] == ran_in[key]
    assert not [e for e in events if e.kind in ("effect-failed", "error")]
    assert_every_effect_finished_once(events)

    # Both processes took part.
    work = Counter(pid for pid, _, _ in runs)
    assert set(work) == {loop.pid for loop in loops}, work
    check_database(db)
