"""Loading an engine directory's code: the layer its engine.py exports, as a factory
`layer(settings, context)` (built for the home the engine runs on) or as one Layer, LAYER.

Every load imports the directory as a new package with a unique name (`pulse_engine_7_…`),
compiled from source, so a reload sees every edit and two loads never share a module object.
Modules of an engine directory import each other relatively (`from ..types import X`); the
directory is never put on sys.path, so an absolute import of a sibling fails loudly instead
of silently reusing a module from an earlier load.

A committed load (what production runs) takes the modules and config.json of the directory's
HEAD commit from git's objects, never from the work tree: an edit made in HOME/engine without
a promote does not run, and EngineCode.uncommitted names it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import json
import linecache
import secrets
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from pulse_cli.git import changed_paths, committed_files, head
from pulse_core import (
    Effect,
    Executor,
    Layer,
    LayerContext,
    LayerFactory,
    Projection,
    PulseError,
    Watcher,
)

OLD_LISTS = ("RULES", "WATCHERS", "EXECUTORS", "PROJECTIONS")

MIN_TICK_MS, MAX_TICK_MS = 100, 600_000
"""The range of default_tick_ms, the same as in the home's config.json."""

_loads = itertools.count(1)


class EngineCodeError(PulseError):
    """An engine directory's code failed to import, or the layer engine.py exports is
    malformed (or its factory raised).

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
    """What one load of an engine directory found: what engine.py exports (its factory
    `layer`, or its LAYER), the git revision of the directory (None outside git), and
    config.json's settings. `uncommitted` (a committed load only) names the work tree's
    files that differ from `revision`: they do not run."""

    exported: Layer | LayerFactory
    revision: str | None
    settings: Mapping[str, Any] = field(default_factory=dict)
    package: str = ""
    uncommitted: tuple[str, ...] = ()
    entry: Path = Path("engine.py")

    @property
    def layer_settings(self) -> dict[str, Any]:
        """config.json as the layer factory gets it: without `default_tick_ms`, pulse's own."""
        return {k: v for k, v in self.settings.items() if k != "default_tick_ms"}

    def forget(self) -> None:
        """Drop this load's modules (and the finder of a committed load) once no engine built
        from it runs: a daemon reloads for months, and each load is a package of its own."""
        if self.package:
            _forget(self.package)

    def build(self, context: LayerContext) -> Layer:
        """The business layer for the home `context` names: LAYER as exported, or what
        `layer(settings, context)` returns, checked part by part. Raises EngineCodeError
        naming the file (and line) when the factory raises or returns something malformed."""
        if isinstance(self.exported, Layer):
            return self.exported
        folder = self.entry.parent
        try:
            layer = self.exported(self.layer_settings, context)
        except Exception as exc:
            file, line = _where(exc, folder, self.entry)
            at = f"{file}:{line}" if line else str(file)
            raise EngineCodeError(
                f"{self.entry}: layer(settings, context) raised at {at}: "
                f"{type(exc).__name__}: {exc} — fix the code or {folder / 'config.json'}",
                file=file, line=line, error_type=type(exc).__name__) from exc
        return _checked(layer, self.entry, "layer(settings, context)")


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


class _CommittedLoader(importlib.abc.SourceLoader):
    """Compiles one module from its committed source (the file at `path` may differ)."""

    def __init__(self, path: str, source: bytes) -> None:
        self.path = path
        self.source = source

    def get_filename(self, fullname: str) -> str:
        return self.path

    def get_data(self, path: str) -> bytes:
        if path != self.path:
            raise OSError(f"{path} is not part of the committed engine code")
        # Tracebacks show the committed line, not the work tree's.
        lines = self.source.decode(errors="replace").splitlines(keepends=True)
        linecache.cache[path] = (len(self.source), None, lines, path)
        return self.source


class _CommittedFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of one load's package among the files of a commit, and only there;
    it stays installed, so a module the code imports later comes from the commit too."""

    def __init__(self, package: str, folder: Path, files: Mapping[str, bytes],
                 revision: str) -> None:
        self.package, self.folder, self.files, self.revision = package, folder, files, revision

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.package and not fullname.startswith(self.package + "."):
            return None
        relative = fullname[len(self.package) + 1:].replace(".", "/")
        where = self.folder / relative
        for name, is_package in ((f"{relative}/__init__.py".lstrip("/"), True),
                                 (f"{relative}.py", False)):
            if name in self.files:
                origin = str(self.folder / name)
                return importlib.util.spec_from_file_location(
                    fullname, origin, loader=_CommittedLoader(origin, self.files[name]),
                    submodule_search_locations=[str(where)] if is_package else None)
        if not relative or any(name.startswith(relative + "/") for name in self.files):
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = [str(where)]
            return spec
        raise ModuleNotFoundError(f"No module named {fullname!r}: no {relative}.py in the "
                                  f"files {self.folder} has committed at {self.revision}",
                                  name=fullname)


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


def _import_committed(package: str, folder: Path, files: Mapping[str, bytes],
                      revision: str) -> ModuleType:
    sys.meta_path.insert(0, _CommittedFinder(package, folder, files, revision))
    return importlib.import_module(f"{package}.engine")


def _forget(package: str) -> None:
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not (isinstance(f, _CommittedFinder) and f.package == package)]


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


def _exported(module: ModuleType, entry: Path) -> Layer | LayerFactory:
    """engine.py's factory `layer`, or its LAYER checked part by part; EngineCodeError
    names what is wrong."""
    factory = getattr(module, "layer", None)
    if factory is not None and hasattr(module, "LAYER"):
        raise EngineCodeError(f"{entry} defines both layer and LAYER — keep one: the factory "
                              "layer(settings, context), or one Layer named LAYER", file=entry)
    if factory is not None:
        if not callable(factory):
            raise EngineCodeError(f"{entry}: layer is a {type(factory).__name__}; it must be "
                                  "a function layer(settings, context) -> pulse_core.Layer",
                                  file=entry)
        return factory  # type: ignore[no-any-return]
    if not hasattr(module, "LAYER"):
        old = [name for name in OLD_LISTS if hasattr(module, name)]
        moved = (f" It defines {', '.join(old)}: the four lists became one layer, "
                 'LAYER = Layer("engine", rules=RULES, watchers=WATCHERS, executors=EXECUTORS, '
                 "projections=PROJECTIONS) (`from pulse_core import Layer`)." if old else "")
        raise EngineCodeError(
            f"{entry} defines no layer — an engine directory exports a factory "
            "layer(settings, context) -> pulse_core.Layer (context.home is the home the "
            'engine runs on), or one Layer named LAYER, like LAYER = Layer("engine", '
            f"rules=[...], watchers=[...], executors=[...], projections=[...]).{moved}",
            file=entry)
    return _checked(module.LAYER, entry, "LAYER")


def _checked(layer: Any, entry: Path, name: str) -> Layer:
    """`layer` (what `name` gave), once it is a Layer whose parts have the right types;
    else EngineCodeError."""
    if not isinstance(layer, Layer):
        raise EngineCodeError(f"{entry}: {name} is a {type(layer).__name__}; it must be a "
                              "pulse_core.Layer", file=entry)
    for part, what, accepts in _PARTS:
        value = getattr(layer, part)
        if not isinstance(value, list | tuple):
            raise EngineCodeError(f"{entry}: {name}.{part} is a {type(value).__name__}; it "
                                  f"must be a list of {what}", file=entry)
        for index, item in enumerate(value):
            if not accepts(item):
                raise EngineCodeError(f"{entry}: {name}.{part}[{index}] is {item!r}, not {what}",
                                      file=entry)
    return layer


def _settings(path: Path, committed: bytes | None = None) -> dict[str, Any]:
    """config.json's settings: the file at `path`, or its `committed` contents."""
    if committed is None and not path.is_file():
        return {}
    try:
        text = committed.decode() if committed is not None else path.read_text(encoding="utf-8")
        settings = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EngineCodeError(f"{path} cannot be read as JSON: {exc} — fix or delete it",
                              file=path, error_type=type(exc).__name__) from exc
    if not isinstance(settings, dict):
        raise EngineCodeError(f"{path} holds a {type(settings).__name__}; it must be a JSON "
                              'object like {"default_tick_ms": 5000}', file=path)
    tick = settings.get("default_tick_ms", MIN_TICK_MS)
    if not isinstance(tick, int) or isinstance(tick, bool) or not \
            MIN_TICK_MS <= tick <= MAX_TICK_MS:
        raise EngineCodeError(f"{path}: default_tick_ms is {tick!r}; it must be an integer "
                              f"from {MIN_TICK_MS} to {MAX_TICK_MS} (milliseconds; it "
                              "overrides the home's config.json), or absent", file=path)
    return settings


def load_engine_code(engine_dir: Path, *, committed: bool = False,
                     revision: str | None = None) -> EngineCode:
    """Import `engine_dir`/engine.py under a fresh package name and return what it exports
    (EngineCode.build makes the layer for a home).

    `committed`: when `engine_dir` is the top of a git work tree with a commit, its modules
    and config.json are those of HEAD, read from git (edits in the work tree do not run;
    EngineCode.uncommitted lists them); elsewhere, and by default, the files on disk.
    `revision` (a full commit of that repository) loads that commit's files instead of
    HEAD's, the way a replay runs the code of an earlier tick.
    Raises EngineCodeError naming the file (and line) and the original error when the code
    fails to import, or when LAYER or config.json is malformed. Blocking: call it in a
    worker thread from async code.
    """
    folder = engine_dir.expanduser().resolve()
    entry = folder / "engine.py"
    checked_out = head(folder)
    if revision is None:
        revision = checked_out
    else:
        committed = True
    files = committed_files(folder, revision) if committed and revision else None
    if not (entry.is_file() if files is None else "engine.py" in files):
        at = f" in the commit {revision}" if files is not None else ""
        raise EngineCodeError(
            f"{entry} does not exist{at} — an engine directory has an engine.py exporting "
            "its layer (a factory layer(settings, context), or LAYER); `upulse init` creates "
            "one", file=entry)
    settings = _settings(folder / "config.json",
                         None if files is None else files.get("config.json", b"{}"))
    package = f"pulse_engine_{next(_loads)}_{secrets.token_hex(4)}"
    try:
        module = (_import_engine(package, folder) if files is None
                  else _import_committed(package, folder, files, str(revision)))
    except (Exception, SystemExit) as exc:
        _forget(package)
        file, line = _where(exc, folder, entry)
        at = f"{file}:{line}" if line else str(file)
        raise EngineCodeError(f"engine code in {folder} failed to import: {at}: "
                              f"{type(exc).__name__}: {exc}", file=file, line=line,
                              error_type=type(exc).__name__) from exc
    try:
        return EngineCode(exported=_exported(module, entry), revision=revision,
                          settings=settings, package=package,
                          uncommitted=changed_paths(folder)
                          if files is not None and revision == checked_out else (),
                          entry=entry)
    except EngineCodeError:
        _forget(package)
        raise
