"""Loading engine code: engine.py's one LAYER, fresh namespaces per load, typed failures."""

from __future__ import annotations

import compileall
import os
import shutil
import sys
from pathlib import Path

import pytest

from pulse_cli.enginedir import TEMPLATE, init_engine_dir
from pulse_cli.loader import EngineCodeError, load_engine_code
from pulse_core._rules import declared_effects, rule_name
from tests.cli.support import OLD_TEXT, RULE, edit, git, note_of


@pytest.fixture
def engine_dir(tmp_path: Path) -> Path:
    """A fresh engine directory (its git work tree), from `upulse init`."""
    assert init_engine_dir(tmp_path / "home")
    return tmp_path / "home" / "engine"


def test_load_reads_the_layer_the_settings_and_the_git_revision(engine_dir: Path) -> None:
    code = load_engine_code(engine_dir)
    assert code.layer.name == "engine"
    assert [rule_name(r) for r in code.layer.rules] == ["inbox_note"]
    assert [t.tag() for t in declared_effects(code.layer.rules[0])] == ["note"]
    assert [w.name for w in code.layer.watchers] == ["inbox"]
    assert [e.name for e in code.layer.executors] == ["NoteExecutor"]
    assert list(code.layer.projections) == []
    assert code.settings == {"default_tick_ms": 5000}
    assert code.revision == git(engine_dir, "rev-parse", "HEAD")


def test_the_template_itself_loads_and_outside_its_own_git_tree_has_no_revision(
        tmp_path: Path) -> None:
    assert load_engine_code(TEMPLATE).revision is None  # inside pulse's repository, not its own
    copy = tmp_path / "plain"
    shutil.copytree(TEMPLATE, copy)
    code = load_engine_code(copy)
    assert code.revision is None and len(code.layer.rules) == 1


async def test_two_loads_never_share_modules_and_a_reload_sees_an_edit_a_pyc_hides(
        engine_dir: Path) -> None:
    first, second = load_engine_code(engine_dir), load_engine_code(engine_dir)
    assert first.package != second.package
    assert first.layer.rules[0] is not second.layer.rules[0]
    assert sys.modules[f"{first.package}.rules.inbox"] is not \
        sys.modules[f"{second.package}.rules.inbox"]
    assert await note_of(engine_dir) == f"3 {OLD_TEXT}"
    assert compileall.compile_dir(engine_dir, quiet=1)
    stamp = (engine_dir / RULE).stat()
    edit(engine_dir / RULE, "waiting in the inbox", "waiting in the INBOX")
    os.utime(engine_dir / RULE, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # the pyc looks fresh
    assert await note_of(engine_dir) == "3 message(s) waiting in the INBOX"


def test_a_committed_load_runs_head_and_names_what_the_work_tree_changed(
        engine_dir: Path) -> None:
    main = git(engine_dir, "rev-parse", "HEAD")
    (engine_dir / "config.json").write_text('{"default_tick_ms": 1}')
    (engine_dir / RULE).unlink()
    code = load_engine_code(engine_dir, committed=True)
    assert code.revision == main
    assert code.settings == {"default_tick_ms": 5000}
    assert [rule_name(r) for r in code.layer.rules] == ["inbox_note"]
    assert code.layer.rules[0].__code__.co_filename == str(engine_dir / RULE)
    assert code.uncommitted == ("config.json", "rules/inbox.py")


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
    ("from pulse_core import Layer\nLAYER = Layer('engine', rules=[42])\n",
     r"LAYER.rules\[0\] is 42"),
    ("LAYER = {}\n", "LAYER is a dict; it must be a pulse_core.Layer"),
    ("X = 1\n", "defines no LAYER"),
    ("from pulse_core import Layer\nfrom .executors.notes import Note\n"
     "LAYER = Layer('engine', watchers=[Note(text='x')])\n", r"LAYER.watchers\[0\] is Note"),
    ("from pulse_core import Layer\nLAYER = Layer('engine', executors={})\n",
     "LAYER.executors is a dict"),
    ("from pulse_core import Layer\nLAYER = Layer('engine', emits=[int])\n",
     r"LAYER.emits\[0\] is <class 'int'>, not Effect classes"),
])
def test_a_malformed_layer_is_refused_by_name(engine_dir: Path, engine_py: str,
                                              message: str) -> None:
    (engine_dir / "engine.py").write_text(engine_py)
    with pytest.raises(EngineCodeError, match=message):
        load_engine_code(engine_dir)


def test_an_engine_py_with_the_four_old_lists_is_told_how_to_move_to_one_layer(
        engine_dir: Path) -> None:
    (engine_dir / "engine.py").write_text(
        "RULES = []\nWATCHERS = []\nEXECUTORS = []\nPROJECTIONS = []\n")
    with pytest.raises(EngineCodeError) as refused:
        load_engine_code(engine_dir)
    message = str(refused.value)
    assert "defines no LAYER" in message
    assert "It defines RULES, WATCHERS, EXECUTORS, PROJECTIONS: the four lists became one " \
        "layer" in message
    assert 'LAYER = Layer("engine", rules=RULES, watchers=WATCHERS' in message
    assert refused.value.file == engine_dir / "engine.py"


def test_a_malformed_config_json_is_refused_by_field(engine_dir: Path) -> None:
    (engine_dir / "config.json").write_text('{"default_tick_ms": "fast"}')
    with pytest.raises(EngineCodeError, match="default_tick_ms is 'fast'"):
        load_engine_code(engine_dir)
    (engine_dir / "config.json").write_text("{not json")
    with pytest.raises(EngineCodeError, match="cannot be read as JSON"):
        load_engine_code(engine_dir)
