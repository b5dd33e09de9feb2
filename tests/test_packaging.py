"""What a plain `pip install upulse` brings is enough to import every module pulse ships.

The development environment holds the test extra and whatever else its tools pulled in, so a
module that needs a package only the development environment has imports fine here and fails
for a user (uvicorn's httptools protocol did: plain uvicorn does not bring httptools). This test
imports every module in a subprocess where any third-party package outside the closure of the
declared runtime dependencies is absent, as it would be in a fresh install of the wheel.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pulse_core", "pulse_survival", "pulse_adapters", "pulse_cli")
# Modules that exist to use an optional extra (docs/deployment.md): each names the extra whose
# packages it may import (a store URL loads them only when it names their backend). Every
# other module must import on the runtime dependencies alone.
EXTRAS_OF = {
    "pulse_core.store._postgres": "postgresql",
    "pulse_core.store._pg_commit": "postgresql",
    "pulse_core.store._pg_listen": "postgresql",
    "pulse_core.store._pg_pool": "postgresql",
    "pulse_core.store._pg_schema": "postgresql",
    "pulse_adapters.mcp": "mcp",
    "pulse_adapters.mcp._calls": "mcp",
    "pulse_adapters.mcp._commitments": "mcp",
    "pulse_adapters.mcp._http": "mcp",
    "pulse_adapters.mcp._notices": "mcp",
    "pulse_adapters.mcp._recall": "mcp",
    "pulse_adapters.mcp._server": "mcp",
    "pulse_adapters.mcp._settings": "mcp",
    "pulse_adapters.mcp._watches": "mcp",
    "pulse_cli.mcp_server": "mcp",
}
NEEDS = {"postgresql": "No module named 'psycopg", "mcp": "No module named 'mcp"}
"""What importing an extra's module says without the extra: the package its users import."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(requirements: list[str], extras: tuple[str, ...] = ()) -> set[str]:
    """The distributions installing `requirements` brings: them and, recursively, what each
    requires outside its own extras."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not any(
                req.marker.evaluate({"extra": e}) for e in ("", *extras)):
            continue
        name = _norm(req.name)
        wanted = {f"{name}[{e}]" for e in req.extras} | {name}
        if wanted <= seen:
            continue
        seen |= wanted
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            sub = Requirement(line)
            if sub.marker is None or sub.marker.evaluate({"extra": ""}) or any(
                    sub.marker.evaluate({"extra": e}) for e in req.extras):
                todo.append(sub)
    return {n for n in seen if "[" not in n}


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


CHILD = r"""
import importlib, importlib.abc, json, sys

absent, modules = json.loads(sys.argv[1])
absent = set(absent)


class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in absent:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Absent())
failed = {}
for module in modules:
    try:
        importlib.import_module(module)
    except Exception as exc:
        failed[module] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


def _unimportable(modules: list[str], allowed: set[str]) -> dict[str, str]:
    owners = metadata.packages_distributions()
    absent = sorted(top for top, dists in owners.items()
                    if not top.startswith(("pulse_", "engine_template", "_"))
                    and not any(_norm(d) in allowed for d in dists))
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps([absent, modules])],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_every_module_imports_on_the_declared_runtime_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    runtime = _closure(project["dependencies"])
    assert {"uvicorn", "starlette", "httpx"} <= runtime  # the closure was read, not empty
    plain = [m for m in _modules() if m not in EXTRAS_OF]
    assert _unimportable(plain, runtime) == {}
    for extra in sorted(set(EXTRAS_OF.values())):  # one child per extra and closure
        modules = [module for module, needed in EXTRAS_OF.items() if needed == extra]
        wider = runtime | _closure(project["optional-dependencies"][extra])
        assert _unimportable(modules, wider) == {}, extra
        without = _unimportable(modules, runtime)
        for module in modules:
            assert NEEDS[extra] in without.get(module, ""), \
                f"{module} no longer needs the {extra} extra: take it out of EXTRAS_OF"


def test_a_module_that_needs_an_undeclared_package_is_named() -> None:
    # the guard itself: without httptools declared, the UI's server cannot load
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    runtime = _closure([r for r in project["dependencies"] if not r.startswith("httptools")])
    assert "httptools" not in runtime
    failed = _unimportable(["pulse_adapters.web._connections"], runtime)
    assert "httptools" in failed.get("pulse_adapters.web._connections", "")
