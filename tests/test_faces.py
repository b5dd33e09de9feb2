"""Every package is entered from outside only through its face (its `__init__`), and public
names say so: `pulse_core.Engine.__module__` is "pulse_core", as httpx's are "httpx".

From outside a package, an import may name the package itself or a public subpackage of it,
never one of its modules (`pulse_core._effects`, `pulse_core.store._base`,
`pulse_survival.ledger`, `pulse_adapters.agents._executor`). Inside a package anything of
its own may be imported. Between adapters the same rule holds. The docs' Python examples
use faces only too. Tests may reach the privates of what they test, so they are not read.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pulse_core", "pulse_survival", "pulse_adapters", "pulse_cli")
# Modules that are faces although not packages: run as programs or loaded by a host.
MODULE_FACES = frozenset({"pulse_core.memory", "pulse_core.demo", "pulse_adapters.hermes.plugin",
                          "pulse_cli.main", "pulse_cli.hermes_plugin"})


def _is_package(dotted: str) -> bool:
    return (ROOT / Path(*dotted.split(".")) / "__init__.py").is_file()


def _module_of(path: Path) -> tuple[str, bool]:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def past_face(importer: str, target: str) -> str | None:
    """The face `importer` must use instead of `target`, or None when `target` is one."""
    if not target.startswith(tuple(p + "." for p in PACKAGES)) and target not in PACKAGES:
        return None
    parts = target.split(".")
    for depth in range(1, len(parts)):
        package, child = ".".join(parts[:depth]), ".".join(parts[:depth + 1])
        if (importer + ".").startswith(package + "."):
            continue  # inside this package: its own modules are its own business
        public = not parts[depth].startswith("_")
        if public and (_is_package(child) or child in MODULE_FACES):
            continue
        return package
    return None


def _imports(tree: ast.AST, module: str, is_init: bool) -> list[tuple[int, str]]:
    own_package = module if is_init else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = own_package.split(".")[:len(own_package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from pulse_core import _effects` enters the private module all the same
            found += [(node.lineno, f"{target}.{a.name}") for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")
                      and _is_package(target)]
    return found


def _source_files() -> list[Path]:
    return [p for package in (*PACKAGES, "engine_template") for p in (ROOT / package).rglob("*.py")]


def faces_crossed() -> list[str]:
    """Every import in pulse's packages that enters another package past its face."""
    crossings = []
    for path in _source_files():
        module, is_init = _module_of(path)
        if module.startswith("engine_template"):
            module = "engine_template"  # the user's directory: only what it imports of pulse
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, target in _imports(tree, module, is_init):
            face = past_face(module, target)
            if face is not None:
                crossings.append(f"{path.relative_to(ROOT)}:{line}: {target} (use {face})")
    return crossings


def test_no_import_enters_a_package_past_its_face() -> None:
    assert faces_crossed() == []


def test_docs_examples_import_only_faces() -> None:
    block = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
    crossings = []
    for page in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for code in block.findall(page.read_text(encoding="utf-8")):
            for _, target in _imports(ast.parse(code), "docs_example", False):
                face = past_face("docs_example", target)
                if face is not None:
                    crossings.append(f"{page.name}: {target} (use {face})")
    assert crossings == []


@pytest.mark.parametrize(("importer", "target", "face"), [
    ("pulse_adapters.web._app", "pulse_core._effects", "pulse_core"),
    ("pulse_core._engine", "pulse_core.store._base", "pulse_core.store"),
    ("pulse_adapters.web._app", "pulse_survival.ledger", "pulse_survival"),
    ("pulse_adapters.openclaw._layer", "pulse_adapters.agents._executor",
     "pulse_adapters.agents"),
    ("pulse_adapters.maintenance._cycle", "pulse_core.maintenance._sleep",
     "pulse_core.maintenance"),
    ("pulse_core.store._base", "pulse_core._events", None),
    ("pulse_adapters.openclaw._layer", "pulse_adapters.agents", None),
    ("pulse_adapters.openclaw._layer", "pulse_adapters.openclaw._cli", None),
    ("pulse_cli.main", "pulse_core.memory", None),
])
def test_the_rule_itself(importer: str, target: str, face: str | None) -> None:
    assert past_face(importer, target) == face


def _faces() -> list[str]:
    faces = []
    for package in PACKAGES:
        for init in sorted((ROOT / package).rglob("__init__.py")):
            dotted = _module_of(init)[0]
            if not any(part.startswith("_") for part in dotted.split(".")):
                faces.append(dotted)
    return [*faces, *sorted(MODULE_FACES - {"pulse_adapters.hermes.plugin", "pulse_cli.main",
                                             "pulse_cli.hermes_plugin"})]


@pytest.mark.parametrize("face", _faces())
def test_public_names_report_their_face(face: str) -> None:
    module = importlib.import_module(face)
    wrong = []
    for name in getattr(module, "__all__", ()):
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        home = obj.__module__
        if home == face or not home.startswith(face + "."):
            continue  # its own face, or another package's name re-exported here
        if any(part.startswith("_") for part in home.split(".")):
            wrong.append(f"{name}: {home}")
    assert wrong == []


@pytest.mark.parametrize("face", _faces())
def test_names_moved_to_their_face_are_still_readable_by_msgspec_and_typing(face: str) -> None:
    import typing

    import msgspec

    module = importlib.import_module(face)
    for name in getattr(module, "__all__", ()):
        obj = getattr(module, name)
        if not inspect.isclass(obj) or obj.__module__ != face:
            continue
        if issubclass(obj, msgspec.Struct):
            msgspec.structs.fields(obj)  # resolves every annotation, or raises NameError
        elif inspect.get_annotations(obj) and not issubclass(obj, BaseException):
            typing.get_type_hints(obj)


def test_a_public_error_pickles_by_its_face() -> None:
    import pickle

    from pulse_core import LayerError

    assert LayerError.__module__ == "pulse_core"
    error = pickle.loads(pickle.dumps(LayerError("layer 'web': setting `port` must be a port")))
    assert type(error) is LayerError and "`port`" in str(error)
