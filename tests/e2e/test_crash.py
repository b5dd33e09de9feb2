"""SIGKILL an engine in the middle of an effect; the next engine on the home finishes the work.

The child runs an Engine whose executor journals `enter <id> <attempt>` / `done <id> <attempt>`
around each Work effect; the first attempt of the blocking effects sleeps, so the kill lands
mid-effect. A second engine (in this process, a different pid) opens the same home and runs
until idle. The dead owner's claim must be taken over at once (its pid is gone), not after its
lease (two minutes) runs out.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from pulse_core import Engine, Event

from .children.workload import JournalExecutor, read_journal
from .support import (
    Child,
    assert_every_effect_finished_once,
    by_key,
    check_database,
    read_events,
    wait_until,
)

COUNT = 12


async def recover(home: Path, journal: Path, blockers: frozenset[int]) -> None:
    """Open a new engine on `home`, run its effects until idle, close it."""
    engine = Engine(home, executors=[JournalExecutor(journal, blockers)],
                    executor_scan_interval=0.05)
    await engine.open()
    try:
        await asyncio.wait_for(engine.executor_loop.run_until_idle(), 15)
    finally:
        await engine.close()


def run_child_until_blocked(
    spawn: Callable[..., Child], home: Path, journal: Path, concurrency: int,
    blockers: tuple[int, ...],
) -> tuple[Child, dict[int, str]]:
    """Start the child engine, wait until every blocker has entered its first attempt;
    returns the child and the effect ids by number."""
    db = home / "events.db"
    block_args = [a for n in blockers for a in ("--block", str(n))]
    child = spawn("crash_child.py", home, journal, "--count", COUNT,
                  "--concurrency", concurrency, *block_args)
    child.wait_for_line("ready", 15)

    def effect_ids() -> dict[int, str] | None:
        effects = read_events(db, {"effect"})
        return {e.data["effect"]["n"]: e.key for e in effects} if len(effects) == COUNT else None

    ids = wait_until(effect_ids, 10, "the child's effects", child)

    def blockers_entered() -> bool:
        entered = {(line[1], line[2]) for line in read_journal(journal) if line[0] == "enter"}
        return all((ids[n], "1") in entered for n in blockers)

    wait_until(blockers_entered, 10, "the blocking effects to start", child)
    return child, ids


def assert_left_by_kill(
    groups: dict[str, list[Event]], ids: dict[int, str], blockers: tuple[int, ...], pid: int
) -> None:
    """With `concurrency` slots and the blockers the first to fill them, everything before
    the blockers is acked, the blockers are claimed by the dead pid, the rest is pending."""
    for n, key in ids.items():
        kinds = [e.kind for e in groups[key]]
        if n < min(blockers):
            assert kinds == ["effect", "effect-executing", "effect-acked"], (n, kinds)
        elif n in blockers:
            assert kinds == ["effect", "effect-executing"], (n, kinds)
            assert groups[key][-1].data["pid"] == pid
            assert groups[key][-1].data["attempt"] == 1
        else:
            assert kinds == ["effect"], (n, kinds)


def assert_recovered(
    home: Path, journal: Path, ids: dict[int, str], blockers: tuple[int, ...], *,
    before: dict[str, list[Event]], dead_pid: int,
) -> None:
    """The interrupted effects ran once more as attempt 2, taken over long before the dead
    owner's lease ran out; every other effect ran and was acked once; nothing is lost."""
    db = home / "events.db"
    events = read_events(db)
    groups = by_key(events)
    lines = read_journal(journal)
    enters = Counter((line[1], int(line[2])) for line in lines if line[0] == "enter")
    dones = Counter((line[1], int(line[2])) for line in lines if line[0] == "done")
    blocked = {ids[n] for n in blockers}
    for key in blocked:
        kinds = [e.kind for e in groups[key]]
        assert kinds == ["effect", "effect-executing", "effect-executing", "effect-acked"], kinds
        retry, acked = groups[key][2], groups[key][3]
        assert retry.data["attempt"] == 2 and acked.data["attempt"] == 2
        assert retry.data["pid"] != dead_pid
        assert enters[(key, 1)] == 1 and enters[(key, 2)] == 1
        assert dones[(key, 1)] == 0 and dones[(key, 2)] == 1
        assert retry.ts < before[key][-1].data["lease_until"] - 60_000
    for n, key in ids.items():
        if key in blocked:
            continue
        kinds = [e.kind for e in groups[key]]
        assert kinds == ["effect", "effect-executing", "effect-acked"], (n, kinds)
        assert groups[key][2].data["attempt"] == 1
        assert enters[(key, 1)] == 1 and dones[(key, 1)] == 1
        assert sum(c for (k, _), c in enters.items() if k == key) == 1
    # Nothing is lost: every effect in the log (ours, and any the survival layer made) has
    # exactly one terminal event; each of ours is acked, none failed.
    assert_every_effect_finished_once(events)
    acks = Counter(e.key for e in events if e.kind == "effect-acked")
    assert all(acks[key] == 1 for key in ids.values())
    failed = [e for e in events if e.kind == "effect-failed" and e.key in ids.values()]
    errors = [e for e in events if e.kind == "error"]
    assert not failed and not errors, (failed, errors)
    lifecycle = [e.kind for e in events if e.kind in ("engine-started", "engine-stopped")]
    assert lifecycle == ["engine-started", "engine-started", "engine-stopped"]
    check_database(db)


@pytest.mark.slow
@pytest.mark.parametrize(("concurrency", "blockers"), [(1, (4,)), (3, (1, 2, 3))],
                         ids=["one-in-flight", "three-in-flight"])
def test_effect_interrupted_by_sigkill_runs_once_more_as_attempt_2_and_nothing_is_lost(
    tmp_path: Path, spawn: Callable[..., Child], concurrency: int, blockers: tuple[int, ...]
) -> None:
    home, journal = tmp_path / "home", tmp_path / "journal.txt"
    child, ids = run_child_until_blocked(spawn, home, journal, concurrency, blockers)
    child.kill()
    before = by_key(read_events(home / "events.db"))
    assert_left_by_kill(before, ids, blockers, child.pid)

    asyncio.run(recover(home, journal, frozenset(blockers)))  # its lease: not waited out
    assert_recovered(home, journal, ids, blockers, before=before, dead_pid=child.pid)


@pytest.mark.slow
def test_effect_of_killed_but_unreaped_owner_is_taken_over_without_waiting_for_its_lease(
    tmp_path: Path, spawn: Callable[..., Child]
) -> None:
    """A killed process stays a zombie until its parent reaps it (here: this process, which
    also runs the next engine). Its pid and start time still exist, but it runs nothing."""
    home, journal = tmp_path / "home", tmp_path / "journal.txt"
    child, ids = run_child_until_blocked(spawn, home, journal, 1, (4,))
    child.kill(reap=False)
    before = by_key(read_events(home / "events.db"))
    assert_left_by_kill(before, ids, (4,), child.pid)

    asyncio.run(recover(home, journal, frozenset({4})))

    assert_recovered(home, journal, ids, (4,), before=before, dead_pid=child.pid)
