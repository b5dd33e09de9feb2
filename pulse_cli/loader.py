"""Loading an engine directory's code: the one Layer its engine.py exports as LAYER.

Every load imports the directory as a new package with a unique name (`pulse_engine_7_…`),
compiled from source, so a reload sees every edit and two loads never share a module object.
Modules of an engine directory import each other relatively (`from ..types import X`); the
directory is never put on sys.path, so an absolute import of a sibling fails loudly instead
of silently reusing a module from an earlier load.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import json
import secrets
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from pulse_cli.git import head
from pulse_core import Effect, Executor, Layer, Projection, PulseError, Watcher

OLD_LISTS = ("RULES", "WATCHERS", "EXECUTORS", "PROJECTIONS")

_loads = itertools.count(1)


class EngineCodeError(PulseError):
    """An engine directory's code failed to import, or engine.py's LAYER is malformed.

    `file` and `line` say where (the deepest frame inside the engine directory), and
    `error_type` names the original exception (SyntaxError, ImportError...).
    """

    def __init__(self, message: str, *, file: Path, line: int | None = None,
                 error_type: str = "EngineCodeError") -> None:
        super().__init__(message)
        self.file = file
        self.line = line
        self.error_type = error_type


@dataclass(frozen=True)
class EngineCode:
    """What one load of an engine directory found: engine.py's LAYER, the git revision of
    the directory (None outside git), and config.json's settings."""

    layer: Layer
    revision: str | None
    settings: Mapping[str, Any] = field(default_factory=dict)
    package: str = ""


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles from source on every import: a cached .pyc written within the same second
    as an edit of the same size would otherwise be taken for the new code."""

    def path_stats(self, path: str) -> Mapping[str, Any]:
        raise OSError("engine code is always compiled from its source")


class _EngineFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of one load's package, with the source-only loader."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self.package + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            spec.loader = _SourceOnlyLoader(fullname, spec.origin)
        return spec


def _import_engine(package: str, folder: Path) -> ModuleType:
    init = folder / "__init__.py"
    if init.is_file():
        spec = importlib.util.spec_from_file_location(
            package, init, loader=_SourceOnlyLoader(package, str(init)),
            submodule_search_locations=[str(folder)])
    else:
        spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
    assert spec is not None
    root = importlib.util.module_from_spec(spec)
    finder = _EngineFinder(package)
    importlib.invalidate_caches()
    sys.meta_path.insert(0, finder)
    sys.modules[package] = root
    try:
        if spec.loader is not None:
            spec.loader.exec_module(root)
        return importlib.import_module(f"{package}.engine")
    finally:
        sys.meta_path.remove(finder)


def _forget(package: str) -> None:
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        del sys.modules[name]


def _where(exc: BaseException, folder: Path, entry: Path) -> tuple[Path, int | None]:
    """The file and line inside `folder` where `exc` was raised (engine.py when unknown)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return Path(exc.filename), exc.lineno
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if Path(frame.filename).is_relative_to(folder):
            return Path(frame.filename), frame.lineno
    return entry, None


_PARTS: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (
    ("rules", "rules (async callables)", callable),
    ("watchers", "Watcher instances", lambda w: isinstance(w, Watcher)),
    ("executors", "Executor instances", lambda e: isinstance(e, Executor)),
    ("projections", "Projection instances", lambda p: isinstance(p, Projection)),
    ("services", "services (async callables)", callable),
    ("emits", "Effect classes", lambda t: isinstance(t, type) and issubclass(t, Effect)),
)


def _exported_layer(module: ModuleType, entry: Path) -> Layer:
    """engine.py's LAYER, checked part by part; EngineCodeError names what is wrong."""
    if not hasattr(module, "LAYER"):
        old = [name for name in OLD_LISTS if hasattr(module, name)]
        moved = (f" It defines {', '.join(old)}: the four lists became one layer, "
                 'LAYER = Layer("engine", rules=RULES, watchers=WATCHERS, executors=EXECUTORS, '
                 "projections=PROJECTIONS) (`from pulse_core import Layer`)." if old else "")
        raise EngineCodeError(
            f"{entry} defines no LAYER — an engine directory exports one pulse_core.Layer "
            f'named LAYER, like LAYER = Layer("engine", rules=[...], watchers=[...], '
            f"executors=[...], projections=[...]).{moved}", file=entry)
    layer = module.LAYER
    if not isinstance(layer, Layer):
        raise EngineCodeError(f"{entry}: LAYER is a {type(layer).__name__}; it must be a "
                              "pulse_core.Layer", file=entry)
    for part, what, accepts in _PARTS:
        value = getattr(layer, part)
        if not isinstance(value, list | tuple):
            raise EngineCodeError(f"{entry}: LAYER.{part} is a {type(value).__name__}; it "
                                  f"must be a list of {what}", file=entry)
        for index, item in enumerate(value):
            if not accepts(item):
                raise EngineCodeError(f"{entry}: LAYER.{part}[{index}] is {item!r}, not {what}",
                                      file=entry)
    return layer


def _settings(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EngineCodeError(f"{path} cannot be read as JSON: {exc} — fix or delete it",
                              file=path, error_type=type(exc).__name__) from exc
    if not isinstance(settings, dict):
        raise EngineCodeError(f"{path} holds a {type(settings).__name__}; it must be a JSON "
                              'object like {"default_tick_ms": 5000}', file=path)
    tick = settings.get("default_tick_ms", 0)
    if not isinstance(tick, int) or isinstance(tick, bool) or tick < 0:
        raise EngineCodeError(f"{path}: default_tick_ms is {tick!r}; it must be an integer "
                              ">= 0 (milliseconds)", file=path)
    return settings


def load_engine_code(engine_dir: Path) -> EngineCode:
    """Import `engine_dir`/engine.py under a fresh package name and return its LAYER.

    Raises EngineCodeError naming the file (and line) and the original error when the code
    fails to import, or when LAYER or config.json is malformed. Blocking: call it in a
    worker thread from async code.
    """
    folder = engine_dir.expanduser().resolve()
    entry = folder / "engine.py"
    if not entry.is_file():
        raise EngineCodeError(
            f"{entry} does not exist — an engine directory has an engine.py exporting one "
            "pulse_core.Layer named LAYER; `upulse init` creates one", file=entry)
    settings = _settings(folder / "config.json")
    package = f"pulse_engine_{next(_loads)}_{secrets.token_hex(4)}"
    try:
        module = _import_engine(package, folder)
    except (Exception, SystemExit) as exc:
        _forget(package)
        file, line = _where(exc, folder, entry)
        at = f"{file}:{line}" if line else str(file)
        raise EngineCodeError(f"engine code in {folder} failed to import: {at}: "
                              f"{type(exc).__name__}: {exc}", file=file, line=line,
                              error_type=type(exc).__name__) from exc
    try:
        return EngineCode(layer=_exported_layer(module, entry), revision=head(folder),
                          settings=settings, package=package)
    except EngineCodeError:
        _forget(package)
        raise
