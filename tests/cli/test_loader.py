"""Loading engine code: fresh namespaces per load, typed failures, and rule reloads into a
running Engine that keep the old chain when the new code is broken."""

from __future__ import annotations

import compileall
import os
import shutil
import sys
from pathlib import Path

import pytest

from pulse_cli.enginedir import TEMPLATE, init_engine_dir
from pulse_cli.loader import RELOAD_KEY, EngineCodeError, load_engine_code, reload_rules
from pulse_core import Engine, ManualClock
from pulse_core.rules import rule_name
from tests.cli.support import NEW_TEXT, OLD_TEXT, RULE, edit, git, note_of


@pytest.fixture
def engine_dir(tmp_path: Path) -> Path:
    """A fresh engine directory (its git work tree), from `upulse init`."""
    assert init_engine_dir(tmp_path / "home")
    return tmp_path / "home" / "engine"


def test_load_reads_the_four_lists_the_settings_and_the_git_revision(engine_dir: Path) -> None:
    code = load_engine_code(engine_dir)
    assert [rule_name(r) for r in code.rules] == ["inbox_note"]
    assert [w.name for w in code.watchers] == ["inbox"]
    assert [e.name for e in code.executors] == ["NoteExecutor"]
    assert code.projections == ()
    assert code.settings == {"default_tick_ms": 5000}
    assert code.revision == git(engine_dir, "rev-parse", "HEAD")


def test_the_template_itself_loads_and_outside_its_own_git_tree_has_no_revision(
        tmp_path: Path) -> None:
    assert load_engine_code(TEMPLATE).revision is None  # inside pulse's repository, not its own
    copy = tmp_path / "plain"
    shutil.copytree(TEMPLATE, copy)
    code = load_engine_code(copy)
    assert code.revision is None and len(code.rules) == 1


async def test_two_loads_never_share_modules_and_a_reload_sees_an_edit_a_pyc_hides(
        engine_dir: Path) -> None:
    first, second = load_engine_code(engine_dir), load_engine_code(engine_dir)
    assert first.package != second.package
    assert first.rules[0] is not second.rules[0]
    assert sys.modules[f"{first.package}.rules.inbox"] is not \
        sys.modules[f"{second.package}.rules.inbox"]
    assert await note_of(engine_dir) == f"3 {OLD_TEXT}"
    assert compileall.compile_dir(engine_dir, quiet=1)
    stamp = (engine_dir / RULE).stat()
    edit(engine_dir / RULE, "waiting in the inbox", "waiting in the INBOX")
    os.utime(engine_dir / RULE, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # the pyc looks fresh
    assert await note_of(engine_dir) == "3 message(s) waiting in the INBOX"


def test_code_that_fails_to_import_names_the_file_line_and_error(engine_dir: Path) -> None:
    modules = set(sys.modules)
    (engine_dir / RULE).write_text("import msgspec\n\nraise LookupError('no inbox here')\n")
    with pytest.raises(EngineCodeError) as failed:
        load_engine_code(engine_dir)
    assert failed.value.file == engine_dir / RULE
    assert failed.value.line == 3
    assert failed.value.error_type == "LookupError"
    assert "rules/inbox.py:3: LookupError: no inbox here" in str(failed.value)
    assert set(sys.modules) == modules  # a failed load leaves no half-imported package

    (engine_dir / RULE).write_text("def broken(:\n")
    with pytest.raises(EngineCodeError, match=r"rules/inbox\.py:1: SyntaxError"):
        load_engine_code(engine_dir)


@pytest.mark.parametrize(("engine_py", "message"), [
    ("RULES = [42]\nWATCHERS = []\nEXECUTORS = []\nPROJECTIONS = []\n", r"RULES\[0\] is 42"),
    ("RULES = []\nWATCHERS = []\nEXECUTORS = []\n", "defines no PROJECTIONS"),
    ("RULES = {}\nWATCHERS = []\nEXECUTORS = []\nPROJECTIONS = []\n", "RULES is a dict"),
    ("from .executors.notes import Note\nRULES = []\nWATCHERS = [Note(text='x')]\n"
     "EXECUTORS = []\nPROJECTIONS = []\n", r"WATCHERS\[0\] is Note"),
])
def test_malformed_public_lists_are_refused_by_name(engine_dir: Path, engine_py: str,
                                                    message: str) -> None:
    (engine_dir / "engine.py").write_text(engine_py)
    with pytest.raises(EngineCodeError, match=message):
        load_engine_code(engine_dir)


def test_a_malformed_config_json_is_refused_by_field(engine_dir: Path) -> None:
    (engine_dir / "config.json").write_text('{"default_tick_ms": "fast"}')
    with pytest.raises(EngineCodeError, match="default_tick_ms is 'fast'"):
        load_engine_code(engine_dir)
    (engine_dir / "config.json").write_text("{not json")
    with pytest.raises(EngineCodeError, match="cannot be read as JSON"):
        load_engine_code(engine_dir)


async def test_reload_swaps_the_business_rules_and_returns_the_revision(
        tmp_path: Path, engine_dir: Path) -> None:
    staging = engine_dir.parent / "staging"
    engine = Engine(tmp_path / "run", rules=load_engine_code(engine_dir).rules,
                    clock=ManualClock())
    await engine.open()
    try:
        edit(staging / RULE, "async def inbox_note(", "async def inbox_notice(")
        edit(staging / "engine.py", "import inbox_note", "import inbox_notice")
        edit(staging / "engine.py", "RULES: list[Rule] = [inbox_note]",
             "RULES: list[Rule] = [inbox_notice]")
        assert engine.rule_names[-1] == "inbox_note"

        assert await reload_rules(engine, staging) == git(staging, "rev-parse", "HEAD")
        assert engine.rule_names[-1] == "inbox_notice"
        assert await engine.events.read(kinds=["error"]) == []
    finally:
        await engine.close()


async def test_reload_of_code_that_fails_to_import_keeps_the_old_chain_and_records_an_error(
        tmp_path: Path, engine_dir: Path) -> None:
    engine = Engine(tmp_path / "run", rules=load_engine_code(engine_dir).rules,
                    clock=ManualClock())
    await engine.open()
    try:
        edit(engine_dir / RULE, f'f"{{count}} {OLD_TEXT}"', f'f"{{count}} {NEW_TEXT}"')
        with (engine_dir / RULE).open("a") as rule:
            rule.write("\nINBOX_LIMIT = inbox_limit_from_config\n")
        with pytest.raises(EngineCodeError, match="failed to import"):
            await reload_rules(engine, engine_dir)
        errors = await engine.events.read(kinds=["error"])
        assert [(e.key, e.origin, e.data["where"], e.data["type"]) for e in errors] == [
            (RELOAD_KEY, "engine", RELOAD_KEY, "NameError")]
        assert str(engine_dir / RULE) in errors[0].data["message"]

        await engine.vitals.record("inbox", {"count": 2})
        decision = await engine.tick()
        assert [getattr(e, "text", None) for e in decision.effects] == [f"2 {OLD_TEXT}"]
    finally:
        await engine.close()
