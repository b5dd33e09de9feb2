"""What promote refuses besides a failing gate step: uncommitted edits on main, and staging or
main changing while the gate runs. Real git, a real engine directory and the real gate, held
in its tests step by an engine test that waits for the word of the test that promotes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from pulse_cli.enginedir import PromoteResult, promote, revision
from pulse_core import SqliteEventStore
from tests.cli.support import RULE, edit, git, make_home, stage_new_text

TEST_TIME_LIMIT_S = 120  # each runs the real gate up to its tests step
HELD_S = 60

HOLD = '''"""Holds the promote gate in its tests step until the promoting test says go."""

import time
from pathlib import Path

SIGNALS = Path({signals!r})


def test_the_gate_waits_here_until_told() -> None:
    (SIGNALS / "started").touch()
    deadline = time.monotonic() + {held}
    while not (SIGNALS / "go").exists():
        assert time.monotonic() < deadline, "the promoting test never said go"
        time.sleep(0.01)
'''


async def _promotes(home: Path) -> list[object]:
    events = await SqliteEventStore.open(home / "events.db", read_only=True)
    try:
        return [e.data for e in await events.read(kinds=["promote", "rollback"])]
    finally:
        await events.close()


def _stage_held(staging: Path, signals: Path) -> None:
    """A good edit staged, and the test that holds the gate until `signals`/go exists."""
    signals.mkdir()
    stage_new_text(staging)
    (staging / "tests" / "test_hold.py").write_text(HOLD.format(signals=str(signals),
                                                                held=HELD_S))


async def _promote_while_held(home: Path, signals: Path,
                              meanwhile: Callable[[], None]) -> PromoteResult:
    """Promote staging (NEW_TEXT and the holding test); once the gate's tests step has
    started, run `meanwhile`, then let the gate go on."""
    _stage_held(home / "staging", signals)
    running = asyncio.create_task(promote(home))
    try:
        async with asyncio.timeout(HELD_S):
            while not (signals / "started").exists():
                assert not running.done(), running.result()
                await asyncio.sleep(0.02)
        await asyncio.to_thread(meanwhile)
    finally:
        (signals / "go").touch()
    return await running


def _refused_at_merge(result: PromoteResult, said: str, main: str) -> None:
    assert not result.ok, result
    assert (result.failed_step, result.revision, result.previous) == ("merge", main, main)
    assert said in result.output
    assert [s.name for s in result.steps] == ["compile", "mypy", "tests", "dry-run",
                                              "backtest"]


async def test_promote_refuses_when_staging_changes_while_the_gate_runs(
        tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    main = revision(home)
    assert main is not None
    staged = git(home / "staging", "rev-parse", "HEAD")

    def ungated_edit() -> None:
        edit(home / "staging" / RULE, "count = inbox_count(curr)",
             "count = inbox_count(curr)  # edited while the gate ran")

    result = await _promote_while_held(home, tmp_path / "signals", ungated_edit)
    _refused_at_merge(result, "staging changed while the gate ran; run promote again", main)
    assert revision(home) == main
    assert git(home / "staging", "rev-parse", "HEAD") == staged  # nothing committed
    assert "edited while the gate ran" in (home / "staging" / RULE).read_text()
    assert await _promotes(home) == []


async def test_promote_refuses_when_main_moves_while_the_gate_runs(tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    before = revision(home)

    def move_main() -> None:
        git(home / "engine", "commit", "-q", "--allow-empty", "-m", "moved during the gate")

    result = await _promote_while_held(home, tmp_path / "signals", move_main)
    moved = revision(home)
    assert moved is not None and moved != before
    _refused_at_merge(result, f"main moved from {before} to {moved} while the gate ran",
                      moved)
    assert git(home / "engine", "log", "-1", "--format=%s") == "moved during the gate"
    assert await _promotes(home) == []


@pytest.mark.parametrize("edited", ["tracked", "untracked"])
async def test_promote_refuses_over_uncommitted_edits_on_main_before_gating(
        tmp_path: Path, edited: str) -> None:
    home = await make_home(tmp_path / "home")
    main = revision(home)
    stage_new_text(home / "staging")
    if edited == "tracked":
        edit(home / "engine" / RULE, "count = inbox_count(curr)",
             "count = inbox_count(curr)  # a hot fix made on main")
    else:
        (home / "engine" / "hotfix.py").write_text("HOT = 1\n")
    result = await promote(home)
    assert not result.ok and result.failed_step == "merge" and result.steps == ()
    assert "has uncommitted changes; production changes only through staging" in (
        result.output)
    assert revision(home) == main
    assert git(home / "engine", "status", "--porcelain") != ""  # the edit is left as it was
    assert await _promotes(home) == []
