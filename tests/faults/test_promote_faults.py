"""Faults of promote, rollback, the gate and the engine directory: real git, real SQLite
files left by a crashed writer, real mypy and real `upulse` processes."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pulse_cli.assembly import load_code
from pulse_cli.dryrun import copy_live_home
from pulse_cli.enginedir import promote
from pulse_cli.gate import MYPY_LOCK_NAME, exclusive_lock, run_gate
from pulse_cli.home import EXIT_REFUSED, Home
from pulse_core import HomeLayout
from tests.cli.runner import Upulse
from tests.cli.support import (
    NEW_TEXT,
    OLD_TEXT,
    ROOT,
    RULE,
    child_env,
    edit,
    first_note,
    git,
    make_home,
    stage_new_text,
)
from tests.e2e.support import read_events

TEST_TIME_LIMIT_S = 120

CRASHED_WRITER = """
import asyncio, os, sys
from pulse_core import EventDraft, SqliteEventStore, VitalsStore

async def main(home):
    events = await SqliteEventStore.open(home + "/events.db")
    await events.append([EventDraft("engine-started", "engine", {"pid": n, "owner": "crash"},
                                    origin="engine") for n in range(3)])
    vitals = await VitalsStore.open(home + "/vitals.db")
    await vitals.record("inbox", {"count": 3})
    os._exit(0)  # killed: nothing closed, the -wal and -shm files stay

asyncio.run(main(sys.argv[1]))
"""


@pytest.fixture(autouse=True)
def warm_mypy_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate's mypy cache the CLI tests share, so pulse_core is not checked from cold."""
    monkeypatch.setenv("MYPY_CACHE_DIR", str(ROOT / ".mypy_cache" / "engine-gate"))


@pytest.fixture
def upulse(tmp_path: Path, warm_mypy_cache: None) -> Iterator[Upulse]:
    runner = Upulse(tmp_path)
    try:
        yield runner
    finally:
        runner.stop_all()


def crash_a_writer(home: Path) -> None:
    """Append three events and a vital to `home` in a process that dies without closing."""
    subprocess.run([sys.executable, "-c", CRASHED_WRITER, str(home)], env=child_env(),
                   check=True, timeout=30)
    assert (home / "events.db-wal").exists() and (home / "events.db-shm").exists()


def database_files(home: Path) -> dict[str, str]:
    """Every SQLite file of the home (databases, -wal, -shm) with its contents' digest."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(home.glob("*.db*"))}


def git_files(repo: Path) -> dict[str, str]:
    """Every file under `repo`/.git (objects, indexes, refs) with its contents' digest."""
    return {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((repo / ".git").rglob("*")) if p.is_file()}


def promotes(home: Path) -> list[object]:
    """The data of every `promote` event in the home's log, in order."""
    return [e.data for e in read_events(home / "events.db", {"promote"})]


def cli_home(upulse: Upulse, home: Path) -> Path:
    """`upulse init`, with an inbox of 3 messages for the engine directory's watcher."""
    upulse.init(home)
    (home / "inbox").mkdir()
    for n in range(3):
        (home / "inbox" / f"message-{n}.txt").write_text("hello")
    return home


# -- item 9: two promotes at once ---------------------------------------------------------


def test_two_promotes_at_once_merge_once_and_record_one_promote(
        upulse: Upulse, tmp_path: Path) -> None:
    """Fault 9: two `upulse promote` processes at once: one merges and records it, the other
    finds nothing to promote and records nothing; rollback then really goes back."""
    home = cli_home(upulse, tmp_path / "home")
    first = git(home / "engine", "rev-parse", "HEAD")
    stage_new_text(home / "staging")
    command = [sys.executable, "-m", "pulse_cli", "promote", "--home", str(home)]
    both = [subprocess.Popen(command, env=upulse.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
            for _ in range(2)]
    outputs = [proc.communicate(timeout=100) for proc in both]

    assert [proc.returncode for proc in both] == [0, 0], outputs
    said = sorted("promoted: main is at" in out for out, _ in outputs)
    assert said == [False, True], outputs
    assert any("nothing to promote" in out for out, _ in outputs), outputs
    main = git(home / "engine", "rev-parse", "HEAD")
    assert promotes(home) == [{"revision": main, "previous": first}]

    upulse("rollback", "--home", home, "--reason", "undo the one promote")
    assert git(home / "engine", "rev-parse", "HEAD^{tree}") == git(
        home / "engine", "rev-parse", f"{first}^{{tree}}")


async def test_a_promote_that_would_merge_nothing_records_nothing(tmp_path: Path) -> None:
    """Fault 9: staging behind main (nothing main lacks) is nothing to promote: no gate, no
    merge, no `promote {revision: X, previous: X}`."""
    home = await make_home(tmp_path / "home")
    (home / "engine" / "NOTES.md").write_text("a commit made on main\n")
    git(home / "engine", "add", "-A")
    git(home / "engine", "commit", "-q", "-m", "on main only")
    main = git(home / "engine", "rev-parse", "HEAD")

    result = await promote(home)

    assert result.ok and result.steps == (), result
    assert "nothing to promote" in result.output
    assert (result.revision, result.previous) == (main, main)
    assert git(home / "engine", "rev-parse", "HEAD") == main
    assert promotes(home) == []


# -- item 10: gates sharing a mypy cache ----------------------------------------------------


async def test_two_gates_at_once_on_one_cold_mypy_cache_both_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault 10: two homes' gates at once, on one cold mypy cache ($MYPY_CACHE_DIR shared),
    with different staged code: both pass (no `INTERNAL ERROR`, no `database is locked`)."""
    monkeypatch.setenv("MYPY_CACHE_DIR", str(tmp_path / "shared-mypy-cache"))
    one, two = await asyncio.gather(make_home(tmp_path / "one"), make_home(tmp_path / "two"))
    stage_new_text(one / "staging")
    edit(two / "staging" / "types.py", "    count: int\n", "    count: int\n    total: int = 0\n")

    gates = await asyncio.gather(*(run_gate(home / "staging", home) for home in (one, two)))

    for steps in gates:
        assert [(s.name, s.ok) for s in steps] == [
            ("compile", True), ("mypy", True), ("tests", True), ("dry-run", True),
            ("backtest", True)], steps


async def test_a_gate_does_not_run_mypy_on_a_cache_another_gate_is_using(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault 10: while another gate's mypy holds the shared cache, a gate's mypy step waits
    for it instead of running beside it (here past the step's time, so the step fails and
    says why)."""
    cache = tmp_path / "shared-mypy-cache"
    cache.mkdir()
    monkeypatch.setenv("MYPY_CACHE_DIR", str(cache))
    home = await make_home(tmp_path / "home")

    async with exclusive_lock(cache / MYPY_LOCK_NAME, 1.0, "the test"):
        steps = await run_gate(home / "staging", home, step_timeout_s=0.5)

    assert [(s.name, s.ok) for s in steps] == [("compile", True), ("mypy", False)], steps
    assert "was held by another gate's mypy for 0.5 s" in steps[-1].output


# -- item 21: a refused promote, the gate's copy and its git checks write nothing -----------


def test_the_gates_copy_of_a_crashed_home_has_every_commit_and_writes_nothing(
        tmp_path: Path) -> None:
    """Fault 21: copying a home a writer died in (its -wal and -shm left) changes none of
    the home's files, not even the -shm, and the copy holds the WAL's commits; with the -shm
    gone too, no -shm is created."""
    home = tmp_path / "home"
    home.mkdir()
    crash_a_writer(home)
    for case in ("-wal and -shm", "-wal only"):
        if case == "-wal only":
            (home / "events.db-shm").unlink()
            (home / "vitals.db-shm").unlink()
        before = database_files(home)
        scratch = tmp_path / f"scratch {case}"
        copy_live_home(Home(home), HomeLayout(scratch))

        assert database_files(home) == before, case
        copied = sqlite3.connect(scratch / "events.db")
        try:
            assert copied.execute("SELECT count(*) FROM events").fetchone() == (3,), case
        finally:
            copied.close()


def test_a_refused_promote_after_a_crash_writes_nothing_in_the_home(
        upulse: Upulse, tmp_path: Path) -> None:
    """Fault 21: after a daemon crash, a promote the gate refuses at its last step (the dry
    run copies the home), and a refused rollback, leave events.db, vitals.db and their -wal
    and -shm byte for byte as they were, and write nothing into engine/.git (no object, no
    index)."""
    home = cli_home(upulse, tmp_path / "home")
    crash_a_writer(home)
    edit(home / "staging" / RULE, "count = inbox_count(curr)",
         'count = inbox_count(curr)\n    if curr.seq:\n'
         '        raise RuntimeError("the dry run reached a broken rule")')
    for tree in ("engine", "staging"):  # same contents, newer times: git would refresh indexes
        os.utime(home / tree / "engine.py", (time.time() + 5, time.time() + 5))
    databases, repository = database_files(home), git_files(home / "engine")

    refused = upulse("promote", "--home", home, ok=False, timeout=100)

    assert refused.returncode == EXIT_REFUSED, refused.stdout + refused.stderr
    assert "the dry-run step failed" in refused.stdout
    nothing = upulse("rollback", "--home", home, "--reason", "no promote yet", ok=False)
    assert "nothing to roll back" in nothing.stderr, nothing.stdout + nothing.stderr
    assert database_files(home) == databases
    assert git_files(home / "engine") == repository
    assert promotes(home) == []


# -- item 26: edits made in HOME/engine without a promote -----------------------------------


async def test_an_edit_made_in_the_engine_directory_does_not_run_and_is_named(
        upulse: Upulse, tmp_path: Path) -> None:
    """Fault 26: an edit made directly in HOME/engine (no staging, no gate, no promote)
    does not run: production loads main's commit, the revision it reports, and names the
    edit; a new module dropped there is not importable either."""
    home = cli_home(upulse, tmp_path / "home")
    engine = home / "engine"
    main = git(engine, "rev-parse", "HEAD")
    edit(engine / RULE, OLD_TEXT, NEW_TEXT)
    (engine / "rules" / "sneaked.py").write_text("RAN = True\n")

    code = load_code(engine)

    assert code.revision == main
    assert await first_note(code) == f"3 {OLD_TEXT}"
    assert code.uncommitted == ("rules/inbox.py", "rules/sneaked.py")
    with pytest.raises(ModuleNotFoundError, match="sneaked"):
        __import__(f"{code.package}.rules.sneaked")
    staged = load_code(engine, staged=True)  # the files on disk, as the gate sees staging
    assert await first_note(staged) == f"3 {NEW_TEXT}"

    report = upulse.json("tick", "--home", home)
    assert isinstance(report, dict)
    assert report["revision"] == main
    assert report["uncommitted"] == ["rules/inbox.py", "rules/sneaked.py"]
    upulse("daemon", "start", "--home", home)
    try:
        logged = (home / "daemon.log").read_text()
        status = upulse("daemon", "status", "--home", home).stdout
        reported = upulse.json("daemon", "status", "--home", home)
    finally:
        upulse("daemon", "stop", "--home", home)
    assert "2 uncommitted change(s) in engine/ (rules/inbox.py, rules/sneaked.py)" in status
    assert isinstance(reported, dict)
    assert reported["status"]["uncommitted"] == ["rules/inbox.py", "rules/sneaked.py"]
    assert f"has 2 uncommitted change(s) that do not run (rules/inbox.py, rules/sneaked.py); " \
        f"revision {main} runs" in logged
