"""The promote gate's backtest: the staged code over the last recorded ticks, its diff shown
before anything moves, recorded with the promote, and a promote refused past --max-diff."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from pulse_adapters.web import _rules as rules_page
from pulse_cli.config import write_default
from pulse_cli.enginedir import promote
from pulse_core import SqliteEventStore
from tests.cli.runner import Upulse
from tests.cli.support import (
    RULE,
    edit,
    git,
    make_home,
    run_ticks,
    stage_new_text,
)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home whose engine ran three ticks, two of which wrote a Note (and kept a record);
    staging holds a changed text of that Note."""
    home = tmp_path_factory.mktemp("backtest") / "home"

    async def run() -> Path:
        await make_home(home)
        write_default(home / "config.json", "backtest")  # what `upulse promote` needs
        await run_ticks(home, [0, 0, 2])
        stage_new_text(home / "staging")
        return home

    return asyncio.run(run())


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and ".git" not in p.parts}


def test_promote_with_max_diff_0_is_refused_by_the_backtest_and_nothing_moves(
        recorded: Path, upulse: Upulse) -> None:
    main = git(recorded / "engine", "rev-parse", "HEAD")
    engine_files = _files(recorded / "engine")
    log = hashlib.sha256((recorded / "events.db").read_bytes()).hexdigest()

    done = upulse("promote", "--max-diff", "0", "--home", recorded, ok=False, timeout=300)

    assert done.returncode == 4, done
    assert "promote refused by the backtest (--max-diff 0); main and the daemon are " \
        "untouched" in done.stderr  # BacktestDiffExceeded, exit 4
    assert "passed  dry-run" in done.stdout and "FAILED  backtest" in done.stdout
    assert "2 recorded tick(s) replayed with the staged code: 2 differ, 2 effect(s) differ" \
        in done.stdout
    assert "note: 0 same, 2 changed, 0 missing, 0 extra" in done.stdout
    assert "tick 1 (event #" in done.stdout and "tick 3 (event #" in done.stdout
    assert git(recorded / "engine", "rev-parse", "HEAD") == main
    assert _files(recorded / "engine") == engine_files
    assert git(recorded / "engine", "status", "--porcelain") == ""
    assert hashlib.sha256((recorded / "events.db").read_bytes()).hexdigest() == log


async def test_a_promote_shows_its_backtest_records_it_and_the_rule_chain_page_shows_it(
        recorded: Path) -> None:
    heard: list[str] = []
    events = await SqliteEventStore.open(recorded / "events.db")
    try:
        result = await promote(recorded, events=events, backtest_ticks=1,
                               progress=heard.append)
        (promoted,) = await events.read(kinds=["promote"])
    finally:
        await events.close()
    assert result.ok, result
    step = result.steps[-1]
    assert step.name == "backtest" and step.ok and step.backtest is not None
    assert (step.backtest.ticks, step.backtest.differing, step.backtest.differs) == (1, 1, 1)
    assert step.backtest.kinds["note"].changed == 1
    assert [t.tick for t in step.backtest.first] == [3]
    at = heard.index(str(step))
    assert heard[at + 1] == "  1 recorded tick(s) replayed with the staged code: 1 differ, " \
                            "1 effect(s) differ"
    assert promoted.data["revision"] == result.revision
    assert promoted.data["backtest"]["differs"] == 1
    entry = rules_page._history_entry(promoted, {})
    assert entry["backtest"] == {"ticks": 1, "differing": 1, "differs": 1,
                                 "kinds": {"note": {"same": 0, "changed": 1, "missing": 0,
                                                    "extra": 0}},
                                 "first": [3]}


async def test_the_backtest_of_the_code_that_ran_the_ticks_finds_no_diff(
        tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    await run_ticks(home, [0, 1])
    edit(home / "staging" / RULE, '"""Decorate the inner decision', '"""Decorate the decision')
    events = await SqliteEventStore.open(home / "events.db")
    try:
        result = await promote(home, events=events, max_diff=0)
    finally:
        await events.close()
    assert result.ok, result
    backtest = result.steps[-1].backtest
    assert backtest is not None and (backtest.ticks, backtest.differs) == (2, 0)
    assert backtest.kinds["note"].same == 2
