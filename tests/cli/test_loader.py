"""Loading engine code: engine.py's layer (a factory, or one LAYER), built for the home it
runs on; fresh namespaces per load, typed failures."""

from __future__ import annotations

import compileall
import os
import shutil
import sys
from pathlib import Path

import pytest

from pulse_cli.enginedir import TEMPLATE, init_engine_dir
from pulse_cli.loader import EngineCode, EngineCodeError, load_engine_code
from pulse_core import Layer, LayerContext, SystemClock
from pulse_core._rules import declared_effects, rule_name
from tests.cli.support import OLD_TEXT, RULE, edit, git, note_of


def built(code: EngineCode, home: Path) -> Layer:
    """`code`'s layer for an engine on `home`."""
    return code.build(LayerContext(home, SystemClock()))


@pytest.fixture
def engine_dir(tmp_path: Path) -> Path:
    """A fresh engine directory (its git work tree), from `upulse init`."""
    assert init_engine_dir(tmp_path / "home")
    return tmp_path / "home" / "engine"


def test_load_reads_the_layer_the_settings_and_the_git_revision(engine_dir: Path) -> None:
    code = load_engine_code(engine_dir)
    layer = built(code, engine_dir.parent)
    assert layer.name == "engine"
    assert [rule_name(r) for r in layer.rules] == ["inbox_note"]
    assert [t.tag() for t in declared_effects(layer.rules[0])] == ["note"]
    assert [w.name for w in layer.watchers] == ["inbox"]
    assert [e.name for e in layer.executors] == ["NoteExecutor"]
    assert list(layer.projections) == []
    assert code.settings == {"inbox": "inbox", "notes": "notes.md"}
    assert code.revision == git(engine_dir, "rev-parse", "HEAD")


def test_the_template_layer_takes_its_paths_from_the_home_it_is_built_for_and_its_settings(
        engine_dir: Path, tmp_path: Path) -> None:
    """Item 12: built for another home, the template reads that home's inbox and writes
    that home's notes.md, wherever the engine directory lies; config.json renames them."""
    code = load_engine_code(engine_dir)
    elsewhere = tmp_path / "elsewhere"
    layer = built(code, elsewhere)
    assert [vars(w)["folder"] for w in layer.watchers] == [elsewhere / "inbox"]
    assert [vars(e)["path"] for e in layer.executors] == [elsewhere / "notes.md"]
    (engine_dir / "config.json").write_text(
        '{"inbox": "mail", "notes": "log/notes.md", "default_tick_ms": 2000}')
    layer = built(load_engine_code(engine_dir), elsewhere)  # pulse's own key is not the layer's
    assert [vars(w)["folder"] for w in layer.watchers] == [elsewhere / "mail"]
    assert [vars(e)["path"] for e in layer.executors] == [elsewhere / "log" / "notes.md"]
    (engine_dir / "config.json").write_text('{"inboxx": "mail"}')
    with pytest.raises(EngineCodeError, match="unknown field `inboxx`"):
        built(load_engine_code(engine_dir), elsewhere)


def test_a_layer_factory_that_raises_or_returns_no_layer_is_refused_with_file_and_line(
        engine_dir: Path, tmp_path: Path) -> None:
    (engine_dir / "config.json").write_text('{"inbox": 5}')
    with pytest.raises(EngineCodeError, match=r"layer\(settings, context\) raised at .*"
                                              r"engine\.py:\d+: ValidationError: Expected "
                                              r"`str`, got `int` - at `\$\.inbox`") as refused:
        built(load_engine_code(engine_dir), tmp_path)
    assert refused.value.file == engine_dir / "engine.py"
    assert refused.value.error_type == "ValidationError"
    (engine_dir / "engine.py").write_text("def layer(settings, context):\n    return 42\n")
    with pytest.raises(EngineCodeError, match=r"layer\(settings, context\) is a int; it "
                                              "must be a pulse_core.Layer"):
        built(load_engine_code(engine_dir), tmp_path)
    (engine_dir / "engine.py").write_text(
        "from pulse_core import Layer\nLAYER = Layer('engine')\n"
        "def layer(settings, context):\n    return LAYER\n")
    with pytest.raises(EngineCodeError, match="defines both layer and LAYER"):
        load_engine_code(engine_dir)


def test_the_template_itself_loads_and_outside_its_own_git_tree_has_no_revision(
        tmp_path: Path) -> None:
    assert load_engine_code(TEMPLATE).revision is None  # inside pulse's repository, not its own
    copy = tmp_path / "plain"
    shutil.copytree(TEMPLATE, copy)
    code = load_engine_code(copy)
    assert code.revision is None and len(built(code, tmp_path).rules) == 1


async def test_two_loads_never_share_modules_and_a_reload_sees_an_edit_a_pyc_hides(
        engine_dir: Path) -> None:
    first, second = load_engine_code(engine_dir), load_engine_code(engine_dir)
    assert first.package != second.package
    assert built(first, engine_dir).rules[0] is not built(second, engine_dir).rules[0]
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
    assert code.settings == {"inbox": "inbox", "notes": "notes.md"}
    rules = built(code, engine_dir.parent).rules
    assert [rule_name(r) for r in rules] == ["inbox_note"]
    assert rules[0].__code__.co_filename == str(engine_dir / RULE)
    assert code.uncommitted == ("config.json", "rules/inbox.py")


def test_a_load_that_is_forgotten_leaves_no_module_and_no_finder(engine_dir: Path) -> None:
    """A daemon reloads for months: each committed load left its finder (holding every
    committed file) in sys.meta_path and its modules in sys.modules for good."""
    modules, finders = set(sys.modules), list(sys.meta_path)
    first = load_engine_code(engine_dir, committed=True)
    second = load_engine_code(engine_dir, committed=True)
    assert len(sys.meta_path) == len(finders) + 2
    first.forget()
    assert not [n for n in sys.modules if n.startswith(first.package)]
    assert [n for n in sys.modules if n.startswith(second.package)]
    second.forget()
    assert set(sys.modules) == modules and sys.meta_path == finders


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
    ("X = 1\n", "defines no layer"),
    ("layer = 1\n", r"layer is a int; it must be a function layer\(settings, context\)"),
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
    assert "defines no layer" in message
    assert "It defines RULES, WATCHERS, EXECUTORS, PROJECTIONS: the four lists became one " \
        "layer" in message
    assert 'LAYER = Layer("engine", rules=RULES, watchers=WATCHERS' in message
    assert refused.value.file == engine_dir / "engine.py"


def test_a_malformed_config_json_is_refused_by_field(engine_dir: Path) -> None:
    (engine_dir / "config.json").write_text('{"default_tick_ms": "fast"}')
    with pytest.raises(EngineCodeError, match="default_tick_ms is 'fast'"):
        load_engine_code(engine_dir)
    (engine_dir / "config.json").write_text('{"default_tick_ms": 50}')
    with pytest.raises(EngineCodeError, match="default_tick_ms is 50; it must be an integer "
                                              "from 100 to 600000"):
        load_engine_code(engine_dir)
    (engine_dir / "config.json").write_text("{not json")
    with pytest.raises(EngineCodeError, match="cannot be read as JSON"):
        load_engine_code(engine_dir)
