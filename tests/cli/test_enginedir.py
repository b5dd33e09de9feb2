"""The engine directory with real git: init, the promote gate, rollback, and the survival
layer's rollback executor driving it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pulse_cli.enginedir import (
    EngineDirError,
    GitEngineDirectory,
    PromoteNotApplied,
    PromoteNotRecorded,
    PromoteResult,
    RolledBack,
    init_engine_dir,
    promote,
    reconcile,
    revision,
)
from pulse_cli.rollback import (
    NothingToRollBack,
    RollbackNotApplied,
    RollbackTargetError,
    rollback,
)
from pulse_core import Engine, Event, SqliteEventStore, open_home
from pulse_core._effects import effect_draft
from pulse_survival import Rollback
from tests.cli.runner import Upulse
from tests.cli.support import (
    NEW_TEXT,
    OLD_TEXT,
    RULE,
    child_env,
    edit,
    git,
    make_home,
    note_of,
    promote_event,
    promote_without_gate,
    stage_new_text,
)


def test_init_lays_out_engine_and_staging_and_a_second_init_changes_nothing(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert init_engine_dir(home)
    engine, staging = home / "engine", home / "staging"
    for folder in (engine, staging):
        for part in ("engine.py", "types.py", "config.json", "rules/inbox.py",
                     "watchers/inbox.py", "executors/notes.py", "tests/test_examples.py"):
            assert (folder / part).is_file(), f"{folder / part} missing"
    assert git(engine, "branch", "--show-current") == "main"
    assert git(staging, "branch", "--show-current") == "staging"
    assert git(engine, "rev-parse", "HEAD") == git(staging, "rev-parse", "HEAD") == revision(home)
    assert git(engine, "log", "--format=%an <%ae>") == "pulse <pulse@localhost>"
    assert git(engine, "status", "--porcelain") == git(staging, "status", "--porcelain") == ""
    listing = sorted(str(p.relative_to(home)) for p in home.rglob("*"))

    assert not init_engine_dir(home)
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == listing
    assert git(engine, "rev-list", "--count", "--all") == "1"


def test_init_refuses_a_half_made_engine_directory(tmp_path: Path) -> None:
    (tmp_path / "engine").mkdir()
    with pytest.raises(EngineDirError, match="staging does not"):
        init_engine_dir(tmp_path)
    assert not (tmp_path / "staging").exists()


def test_the_template_tests_pass_inside_a_fresh_engine_directory(tmp_path: Path) -> None:
    assert init_engine_dir(tmp_path)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q"], cwd=tmp_path / "engine",
                          env=child_env(), capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout
    assert git(tmp_path / "engine", "status", "--porcelain") == ""


# -- promote -----------------------------------------------------------------------------------


async def _read_all(home: Path) -> list[Event]:
    events = await SqliteEventStore.open(home / "events.db")
    try:
        return await events.read()
    finally:
        await events.close()


PROGRESS: list[str] = []


@pytest.fixture(scope="module")
def promoted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PromoteResult, str]:
    """A home whose staged NEW_TEXT edit went through promote; and main's revision before.
    PROGRESS holds what the promote reported as it went."""
    home = tmp_path_factory.mktemp("promoted") / "home"

    async def run() -> tuple[Path, PromoteResult, str]:
        async with asyncio.timeout(60):
            await make_home(home)
            before = git(home / "engine", "rev-parse", "HEAD")
            stage_new_text(home / "staging")
            events = await SqliteEventStore.open(home / "events.db")
            try:
                return home, await promote(home, events=events,
                                           progress=PROGRESS.append), before
            finally:
                await events.close()

    return asyncio.run(run())


def test_promote_reports_each_gate_step_as_it_starts_and_ends(
        promoted: tuple[Path, PromoteResult, str]) -> None:
    _, result, _ = promoted
    expected = [line for step in result.steps
                for line in (f"running {step.name} …", str(step))]
    expected.append("  no recorded ticks to backtest (only ticks that write keep a record): "
                    "passes")
    assert expected == PROGRESS
    assert PROGRESS[1].startswith("passed  compile")


async def test_a_promote_the_log_refuses_to_record_leaves_main_where_it_was(
        tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    main = revision(home)
    stage_new_text(home / "staging")
    refusing = await open_home(home, read_only=True)  # a real log that refuses the append
    try:
        with pytest.raises(PromoteNotRecorded,
                           match=f"main was not moved \\(it stays at {main}\\)"):
            await promote(home, events=refusing.events)
    finally:
        await refusing.close()
    assert revision(home) == main
    assert git(home / "engine", "status", "--porcelain") == ""
    assert [e for e in await _read_all(home) if e.kind == "promote"] == []

    result = await promote(home)  # the log works again: the same staged code goes through
    assert result.ok and revision(home) == result.revision != main
    assert [e.data for e in await _read_all(home) if e.kind == "promote"] == [
        {"revision": result.revision, "previous": main}]


async def test_promote_of_a_good_edit_merges_records_a_promote_event_and_loads_the_new_rule(
        promoted: tuple[Path, PromoteResult, str]) -> None:
    home, result, before = promoted
    assert result.ok, result
    assert [s.name for s in result.steps] == ["compile", "mypy", "tests", "dry-run",
                                              "backtest"]
    assert all(s.ok for s in result.steps)
    assert result.steps[-2].output.startswith("decision: ")
    assert result.steps[-1].backtest is not None and result.steps[-1].backtest.ticks == 0
    main = git(home / "engine", "rev-parse", "HEAD")
    assert (result.revision, result.previous) == (main, before)
    assert git(home / "engine", "log", "-1", "--format=%s") == "promote: staged changes"
    assert git(home / "staging", "status", "--porcelain") == ""
    promotes = [e for e in await _read_all(home) if e.kind == "promote"]
    assert [(e.data, e.origin) for e in promotes] == [
        ({"revision": main, "previous": before}, "cli")]
    assert await note_of(home / "engine") == f"3 {NEW_TEXT}"


async def test_promote_with_nothing_staged_changes_nothing(
        promoted: tuple[Path, PromoteResult, str]) -> None:
    home, result, _ = promoted
    events = await SqliteEventStore.open(home / "events.db")
    try:
        again = await promote(home, events=events)
        assert again.ok and again.steps == () and "nothing to promote" in again.output
        assert again.revision == result.revision
        assert len(await events.read(kinds=["promote"])) == 1
    finally:
        await events.close()


@pytest.fixture(scope="module")
def gated_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One home shared by the refusal tests: a refused promote leaves nothing to clean."""
    return asyncio.run(make_home(tmp_path_factory.mktemp("gated") / "home"))


@pytest.fixture
def staging_reset(gated_home: Path) -> Iterator[Path]:
    """The shared home, with staging's files put back after the test's bad edit."""
    yield gated_home
    git(gated_home / "staging", "reset", "-q", "--hard")
    git(gated_home / "staging", "clean", "-q", "-fd")


STRAY = 'class Stray(Note, tag="stray"):\n    """Handled by nobody."""\n\n\n'
BAD_EDITS = {
    "compile": ("return Decision(effects, tick_ms)", "return Decision(effects, tick_ms"),
    "mypy": ("count = inbox_count(curr)", 'count: int = str(inbox_count(curr))'),
    "tests": (f'f"{{count}} {OLD_TEXT}"', f'f"{{count}} {NEW_TEXT}"'),
    "dry-run": ("count = inbox_count(curr)",
                'count = inbox_count(curr)\n    if curr.seq:\n'
                '        raise RuntimeError("the dry run reached a broken rule")'),
    "dry-run-hang": ("count = inbox_count(curr)",
                     "count = inbox_count(curr)\n    if curr.seq:\n"
                     "        import time\n        time.sleep(60)"),
    # A rule that declares an effect no executor handles: the engine refuses to be built.
    "dry-run-declared": ("@emits(Note)\n", STRAY + "@emits(Note, Stray)\n"),
    # A rule that emits, without declaring it, an effect no executor handles.
    "dry-run-emitted": ("count = inbox_count(curr)\n",
                        "count = inbox_count(curr)\n    if curr.seq:\n"
                        '        effects = [*effects, Stray(text="lost")]\n'),
}



@pytest.mark.parametrize("bad", sorted(BAD_EDITS))
async def test_promote_refuses_a_bad_edit_at_its_step_and_changes_nothing(
        staging_reset: Path, bad: str) -> None:
    home = staging_reset
    old, new = BAD_EDITS[bad]
    edit(home / "staging" / RULE, old, new)
    if bad == "dry-run-emitted":
        edit(home / "staging" / RULE, "@emits(Note)\n", STRAY + "@emits(Note)\n")
    main, staged = (git(home / d, "rev-parse", "HEAD") for d in ("engine", "staging"))
    vitals = hashlib.sha256((home / "vitals.db").read_bytes()).hexdigest()
    before = await _read_all(home)
    events = await SqliteEventStore.open(home / "events.db")
    try:
        result = await promote(home, events=events, dry_run_timeout_s=1.0)
    finally:
        await events.close()

    assert not result.ok
    assert result.failed_step == ("dry-run" if bad.startswith("dry-run") else bad), result
    assert result.steps[-1].name == result.failed_step and not result.steps[-1].ok
    assert result.revision == result.previous == main
    assert git(home / "engine", "rev-parse", "HEAD") == main
    assert git(home / "staging", "rev-parse", "HEAD") == staged
    assert git(home / "engine", "status", "--porcelain") == ""
    assert await _read_all(home) == before
    assert hashlib.sha256((home / "vitals.db").read_bytes()).hexdigest() == vitals
    assert not (home / "vitals.db-wal").exists()
    expected = {"compile": "rules/inbox.py:", "mypy": "rules/inbox.py:",
                "tests": "failed", "dry-run": "the dry run reached a broken rule",
                "dry-run-hang": "did not return a Decision within 1 s",
                "dry-run-declared": "UnhandledEffect: inbox_note (layer 'engine') emits 'stray'",
                "dry-run-emitted": "the dry-run tick emitted effects no executor handles: "
                                   "stray"}[bad]
    assert expected in result.output


# -- rollback ----------------------------------------------------------------------------------


async def test_rollback_reverts_with_a_new_commit_records_it_and_loads_the_old_rule(
        tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    first = git(home / "engine", "rev-parse", "HEAD")
    stage_new_text(home / "staging")
    events = await SqliteEventStore.open(home / "events.db")
    try:
        promoted = await promote_without_gate(home, events)
        assert await note_of(home / "engine") == f"3 {NEW_TEXT}"

        done = await rollback(home, None, events=events, reason="errors after the promote")
        now = done.revision

        rollbacks = await events.read(kinds=["rollback"])
    finally:
        await events.close()
    engine = home / "engine"
    assert now == git(engine, "rev-parse", "HEAD") == revision(home)
    assert git(engine, "log", "--format=%H", f"{first}..{now}").split() == [now, promoted]
    assert git(engine, "log", "-1", "--format=%s") == (
        f"Revert to {first[:12]}: errors after the promote")
    assert git(engine, "rev-parse", f"{now}^{{tree}}") == git(engine, "rev-parse",
                                                               f"{first}^{{tree}}")
    kept = done.kept
    assert kept is not None and kept.startswith("rolled-back/") and kept.endswith(
        "-" + promoted[:12])
    assert git(engine, "rev-parse", kept) == promoted  # the rolled-back edit, on a branch
    assert done == RolledBack(now, first, kept, "synced")
    assert f"kept on branch {kept}" in str(done)
    assert kept in git(engine, "log", "-1", "--format=%b")
    assert [(e.data, e.origin) for e in rollbacks] == [(
        {"revision": now, "to": first, "reason": "errors after the promote", "kept": kept,
         "staging": "synced"}, "cli")]
    assert await note_of(engine) == f"3 {OLD_TEXT}"
    assert git(home / "staging", "rev-parse", "HEAD") == now
    assert await note_of(home / "staging") == f"3 {OLD_TEXT}"


async def test_rollback_undoes_a_promote_that_arrived_as_a_merge_exactly(tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    engine, staging = home / "engine", home / "staging"
    events = await SqliteEventStore.open(home / "events.db")
    try:
        stage_new_text(staging)
        await promote_without_gate(home, events)
        (staging / "rules" / "extra.py").write_text('"""Staged, not yet promoted."""\n')
        git(staging, "add", "-A")
        git(staging, "commit", "-q", "-m", "unpromoted work")
        reverted = (await rollback(home, None, events=events, reason="first")).revision
        assert "merge main" in git(staging, "log", "-1", "--format=%s")  # staging merged main
        await promote_without_gate(home, events)  # main now holds a merge commit

        again = (await rollback(home, None, events=events, reason="second")).revision
    finally:
        await events.close()
    assert git(engine, "rev-parse", f"{again}^{{tree}}") == git(engine, "rev-parse",
                                                                 f"{reverted}^{{tree}}")
    assert not (engine / "rules" / "extra.py").exists()
    assert await note_of(engine) == f"3 {OLD_TEXT}"


async def test_rollback_to_a_revision_that_is_not_on_main_is_refused(tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    (home / "staging" / "notes.txt").write_text("only on staging\n")
    git(home / "staging", "add", "-A")
    git(home / "staging", "commit", "-q", "-m", "staging only")
    side = git(home / "staging", "rev-parse", "HEAD")
    main = revision(home)
    events = await SqliteEventStore.open(home / "events.db")
    try:
        with pytest.raises(RollbackTargetError, match="not an earlier revision of main — "):
            await rollback(home, side, events=events, reason="wrong")
        with pytest.raises(RollbackTargetError) as unknown:
            await rollback(home, "no-such-branch", events=events, reason="wrong")
        assert str(unknown.value) == (
            f"cannot roll back to 'no-such-branch': {home / 'engine'} has no such revision — "
            f"name one of main's revisions (`git -C {home / 'engine'} log --oneline main` "
            "lists main's revisions), or leave it out to undo the last promote")
        with pytest.raises(EngineDirError, match="nothing to roll back"):
            await rollback(home, None, events=events, reason="nothing promoted")
        assert await events.read(kinds=["rollback"]) == []
    finally:
        await events.close()
    assert revision(home) == main


async def survival_rollback(home: Path, reason: str
                            ) -> tuple[list[Event], list[Event], list[RolledBack]]:
    """A Rollback effect run by an engine on `home` through GitEngineDirectory: the effect's
    events, every `rollback` event, and what the directory reported to reload."""
    reloaded: list[RolledBack] = []

    async def on_rollback(done: RolledBack) -> None:
        reloaded.append(done)

    engine = Engine(home, engine_directory=GitEngineDirectory(home, on_rollback=on_rollback))
    await engine.open()
    try:
        stored = await engine.append([effect_draft(Rollback(reason=reason), origin="agent")])
        await engine.executor_loop.run_until_idle()
        effect = await engine.events.read(key=stored.events[0].key)
        rollbacks = await engine.events.read(kinds=["rollback"])
    finally:
        await engine.close()
    return effect, rollbacks, reloaded


async def test_git_engine_directory_serves_the_survival_rollback_executor(
        tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    stage_new_text(home / "staging")
    events = await SqliteEventStore.open(home / "events.db")
    try:
        promoted = await promote_without_gate(home, events)
    finally:
        await events.close()
    done, rollbacks, reloaded = await survival_rollback(home, "test")
    now = git(home / "engine", "rev-parse", "HEAD")
    assert [e.kind for e in done] == ["effect", "effect-executing", "effect-acked"]
    assert done[-1].data["result"] == {"revision": now, "emergency": False}
    assert git(home / "engine", "rev-parse", "HEAD^") == promoted
    assert git(home / "engine", "log", "-1", "--format=%s").startswith("Revert to ")
    assert [(e.data["reason"], e.origin) for e in rollbacks] == [("test", "survival")]
    assert [r.revision for r in reloaded] == [now]
    assert rollbacks[0].data["kept"] == reloaded[0].kept
    assert git(home / "engine", "rev-parse", f"{reloaded[0].kept}") == promoted
    assert f"kept on branch {reloaded[0].kept}" in str(reloaded[0])  # the daemon's log line
    assert await note_of(home / "engine") == f"3 {OLD_TEXT}"


# -- when git or the process fails between the log and main --------------------------------------


def _lock_main_once_staging_moves(engine: Path) -> None:
    """A real git hook: once promote has committed on staging, main's index.lock appears, so
    the fast-forward of main after the `promote` event is the one step that fails."""
    hook = engine / ".git" / "hooks" / "reference-transaction"
    hook.write_text("#!/bin/sh\n"
                    '[ "$1" = committed ] || exit 0\n'
                    f"grep -q ' refs/heads/staging$' && : > '{engine / '.git' / 'index.lock'}'\n"
                    "exit 0\n")
    hook.chmod(0o755)


def _kept_branches(engine: Path) -> list[str]:
    return git(engine, "branch", "--list", "rolled-back/*", "--format=%(refname:short)").split()


async def test_a_promote_whose_main_cannot_move_after_its_event_says_so_in_one_line(
        tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    engine, main = home / "engine", revision(home)
    stage_new_text(home / "staging")
    _lock_main_once_staging_moves(engine)

    with pytest.raises(PromoteNotApplied) as failed:
        await promote(home)

    staged = git(home / "staging", "rev-parse", "HEAD")
    lock = engine / ".git" / "index.lock"
    assert str(failed.value) == (
        f"the promote of {staged} was recorded but main could not move and stays at {main} "
        f"(error: Unable to create '{lock}': File exists.); a `rollback` event notes it — "
        f"fix what git says (a leftover {lock}: remove it if no git command is running "
        "there), then `upulse promote` again")
    assert revision(home) == main
    logged = [(e.kind, e.data) for e in await _read_all(home)
              if e.kind in ("promote", "rollback")]
    assert logged == [
        ("promote", {"revision": staged, "previous": main}),
        ("rollback", {"revision": main, "to": main, "kept": None, "staging": "untouched",
                      "reason": f"the promote of {staged} was recorded but main could not "
                                f"move: error: Unable to create '{lock}': File exists."})]

    lock.unlink()
    (engine / ".git" / "hooks" / "reference-transaction").unlink()
    again = await promote(home)
    assert again.ok and revision(home) == again.revision == staged


async def test_a_rollback_git_cannot_apply_leaves_no_branch_and_no_event(
        tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    engine = home / "engine"
    stage_new_text(home / "staging")
    events = await SqliteEventStore.open(home / "events.db")
    try:
        promoted = await promote_without_gate(home, events)
        lock = engine / ".git" / "index.lock"
        lock.touch()
        for _ in range(2):  # the survival layer's executor tries twice
            with pytest.raises(RollbackNotApplied) as failed:
                await rollback(home, None, events=events, reason="errors")
            assert "\n" not in str(failed.value)
            assert str(failed.value).endswith(
                f"could not move main, which stays at {promoted} (error: Unable to create "
                f"'{lock}': File exists.); nothing was recorded — fix what git says (a "
                f"leftover {lock}: remove it if no git command is running there), then roll "
                "back again")
        assert revision(home) == promoted
        assert _kept_branches(engine) == []
        assert await events.read(kinds=["rollback"]) == []

        lock.unlink()
        done = await rollback(home, None, events=events, reason="errors")
        assert _kept_branches(engine) == [done.kept]
        assert len(await events.read(kinds=["rollback"])) == 1
    finally:
        await events.close()


async def test_a_rollback_that_changes_nothing_is_refused_and_writes_nothing(
        tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    engine = home / "engine"
    first = revision(home)
    stage_new_text(home / "staging")
    events = await SqliteEventStore.open(home / "events.db")
    try:
        promoted = await promote_without_gate(home, events)
        with pytest.raises(NothingToRollBack) as head_refused:
            await rollback(home, "HEAD", events=events, reason="no change")
        assert str(head_refused.value) == (
            f"nothing to roll back: main already has the files of {promoted[:12]} — to go "
            f"further back, name an earlier revision (`git -C {engine} log --oneline main` "
            "lists them)")
        done = await rollback(home, None, events=events, reason="first")
        logged = await events.read()
        with pytest.raises(NothingToRollBack, match=f"the files of {first[:12]}") as again:
            await rollback(home, None, events=events, reason="second")
        assert (again.value.revision, again.value.to) == (done.revision, first)
        assert await events.read() == logged
        assert [e.data["kept"] for e in logged if e.kind == "rollback"] == [done.kept]
    finally:
        await events.close()
    assert revision(home) == done.revision
    assert _kept_branches(engine) == [done.kept]


def test_upulse_rollback_to_the_files_main_has_exits_1_and_neither_records_nor_reloads(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("daemon", "start", "--home", home)
    main = revision(home)
    assert main is not None
    before = asyncio.run(_read_all(home))

    refused = upulse("rollback", "HEAD", "--home", home, ok=False)

    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stdout == ""
    assert refused.stderr.strip() == (
        f"upulse rollback: nothing to roll back: main already has the files of {main[:12]} — "
        f"to go further back, name an earlier revision (`git -C {home / 'engine'} log "
        "--oneline main` lists them)")
    assert [e for e in asyncio.run(_read_all(home)) if e.kind == "rollback"] == []
    assert [e.seq for e in asyncio.run(_read_all(home))][:len(before)] == [
        e.seq for e in before]
    status = json.loads(upulse("daemon", "status", "--home", home, "--json").stdout)
    assert status["status"]["reloads"] == 0
    assert revision(home) == main and _kept_branches(home / "engine") == []


async def test_a_survival_rollback_with_nothing_to_change_is_acked_and_neither_records_nor_reloads(
        tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    stage_new_text(home / "staging")
    events = await SqliteEventStore.open(home / "events.db")
    try:
        await promote_without_gate(home, events)
        done = await rollback(home, None, events=events, reason="by hand")
    finally:
        await events.close()
    effect, rollbacks, reloaded = await survival_rollback(home, "again")
    assert [e.kind for e in effect] == ["effect", "effect-executing", "effect-acked"]
    assert effect[-1].data["result"] == {"revision": done.revision, "emergency": False}
    assert [e.data["reason"] for e in rollbacks] == ["by hand"]
    assert reloaded == []
    assert revision(home) == done.revision


async def test_reconcile_records_that_main_never_moved_after_a_recorded_promote(
        tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    main = revision(home)
    stage_new_text(home / "staging")
    git(home / "staging", "commit", "-q", "-am", "promoted, then the process stopped")
    staged = git(home / "staging", "rev-parse", "HEAD")
    events = await SqliteEventStore.open(home / "events.db")
    try:
        await events.append([promote_event(staged, main)])
        reason = await reconcile(home, events)
        assert await reconcile(home, events) is None  # the log agrees with main now
        logged = [(e.kind, e.data) for e in await events.read(kinds=["promote", "rollback"])]
    finally:
        await events.close()
    assert reason == (f"a promote to {staged} was recorded but main never moved (the process "
                      "stopped in between)")
    assert logged[1:] == [("rollback", {"revision": main, "to": main, "reason": reason,
                                        "kept": None, "staging": "untouched"})]
    assert revision(home) == main


async def test_rollback_first_reconciles_a_promote_that_never_moved_main(
        tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    main = revision(home)
    events = await SqliteEventStore.open(home / "events.db")
    try:
        await events.append([promote_event("0" * 40, main)])
        with pytest.raises(NothingToRollBack):  # auto_rollback after the crash: main has it
            await rollback(home, None, events=events, reason="errors", origin="survival")
        logged = [(e.kind, e.data, e.origin) for e in await events.read(kinds=["rollback"])]
    finally:
        await events.close()
    assert logged == [("rollback", {
        "revision": main, "to": main, "kept": None, "staging": "untouched",
        "reason": f"a promote to {'0' * 40} was recorded but main never moved (the process "
                  "stopped in between)"}, "survival")]


async def test_promote_first_reconciles_a_promote_that_never_moved_main(
        tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    main = revision(home)
    events = await SqliteEventStore.open(home / "events.db")
    try:
        await events.append([promote_event("0" * 40, main)])
    finally:
        await events.close()
    stage_new_text(home / "staging")

    result = await promote(home)

    assert result.ok and revision(home) == result.revision != main
    logged = [(e.kind, e.data["revision"]) for e in await _read_all(home)
              if e.kind in ("promote", "rollback")]
    assert logged == [("promote", "0" * 40), ("rollback", main),
                      ("promote", result.revision)]
