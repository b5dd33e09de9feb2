"""What a plain (non-editable) install sees: a Python whose start-up imports nothing of pulse.

An editable install runs a finder from a .pth file at every start-up, which imports the
standard library's `types` before anything else; a wheel install does not, so there a
module named `types.py` in the working directory would be found first. `plain_python`
makes such an interpreter quickly: a venv without pip whose only .pth lists folders (this
environment's site-packages, less the packages left out, and this checkout), which Python
adds to sys.path without running anything. .ci/wheel-install checks the real wheel.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.support import ROOT, make_home, stage_new_text

PROMOTE = """
import asyncio, json, sys
from pathlib import Path
import msgspec
from pulse_cli.enginedir import promote
result = asyncio.run(promote(Path(sys.argv[1])))
print(json.dumps(msgspec.to_builtins(result)))
"""


def plain_python(folder: Path, *, without: tuple[str, ...] = ()) -> Path:
    """A python that imports pulse from this checkout and its dependencies from this
    environment, except the distributions named in `without`, with no start-up hook."""
    venv = folder / "plain-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=60)
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    packages = folder / "plain-site-packages"
    packages.mkdir()
    left_out = {name.replace("-", "_").lower() for name in without}
    for entry in site.iterdir():
        stem = entry.name.split("-")[0].split(".")[0].lower()
        if stem.lstrip("_") not in left_out and not entry.name.endswith(".pth"):
            (packages / entry.name).symlink_to(entry)
    own = next((venv / "lib").glob("python3*/site-packages"))
    (own / "plain.pth").write_text(f"{packages}\n{ROOT}\n")
    return venv / "bin" / "python"


def test_a_plain_python_does_not_import_types_at_start_up(tmp_path: Path) -> None:
    python = plain_python(tmp_path)
    done = subprocess.run([python, "-c", "import sys; print('types' in sys.modules)"],
                          capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path)
    assert done.stdout.strip() == "False"  # what an editable install hides
    done = subprocess.run([python, "-c", "import pulse_cli; print(pulse_cli.__file__)"],
                          capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path)
    assert done.stdout.strip().startswith(str(ROOT))


async def test_promote_from_a_plain_install_gates_an_engine_with_stdlib_named_modules(
        tmp_path: Path) -> None:
    """The engine's types.py (and a json.py) are the engine's, never the standard library's,
    in every step of the gate."""
    home = await make_home(tmp_path / "home")
    stage_new_text(home / "staging")
    (home / "staging" / "json.py").write_text('"""Shadows nothing: it is <engine>.json."""\n')
    python = plain_python(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = await asyncio.to_thread(lambda: subprocess.run(
        [python, "-c", PROMOTE, str(home)], capture_output=True, text=True, timeout=300,
        check=False, cwd=tmp_path, env=env))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["ok"], "\n".join(f"{s['name']}: {s['output']}" for s in result["steps"])
    assert [s["name"] for s in result["steps"]] == ["compile", "mypy", "tests", "dry-run",
                                                    "backtest"]


@pytest.fixture(autouse=True)
def _no_inherited_safe_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PYTHONSAFEPATH set around the suite would hide the bug these tests look for."""
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
