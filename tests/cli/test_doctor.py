"""`upulse doctor`, and promote naming every missing tool at once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from pulse_cli.doctor import doctor
from pulse_cli.home import Home
from tests.cli.support import make_home
from tests.cli.test_wheel import plain_python

DOCTOR = """
import sys
from pathlib import Path
from pulse_cli.doctor import doctor
from pulse_cli.home import Home
sys.exit(doctor(Home(Path(sys.argv[1])), as_json=sys.argv[2] == "json"))
"""
PROMOTE = """
import asyncio, sys
from pathlib import Path
from pulse_cli.enginedir import promote
asyncio.run(promote(Path(sys.argv[1])))
"""


def test_doctor_passes_where_everything_is_installed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor(Home(tmp_path / "new-home"), as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"]
    assert [c["name"] for c in report["checks"]] == [
        "python", "git", "mypy", "pytest", "survival", "home"]
    assert "it will be made in" in report["checks"][-1]["detail"]


def test_doctor_refuses_a_home_that_cannot_be_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    assert doctor(Home(tmp_path / "file" / "home"), as_json=False) == 1
    out, err = capsys.readouterr()
    assert "MISSING" in out
    assert err.count("\n") == 1
    assert f"{tmp_path / 'file'} is not a folder — choose another home" in err


def _without_tools(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A plain python lacking mypy and pytest, and an environment whose PATH has no git."""
    python = plain_python(tmp_path, without=("mypy", "pytest"))
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
           "PATH": str(tmp_path / "no-tools")}
    return python, env


def test_doctor_lists_every_missing_tool_in_one_message(tmp_path: Path) -> None:
    python, env = _without_tools(tmp_path)
    done = subprocess.run([python, "-c", DOCTOR, str(tmp_path / "home"), "text"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("upulse doctor: 3 problem(s): "), lines
    assert "git is not on PATH" in lines[0]
    for module in ("mypy", "pytest"):
        assert f"{module} is not installed for {python}" in lines[0]
        assert f"-m pip install {module}`" in lines[0]


async def test_promote_without_its_tools_names_all_of_them_before_anything_runs(
        tmp_path: Path) -> None:
    home = await make_home(tmp_path / "home")
    python, env = _without_tools(tmp_path)
    done = await asyncio.to_thread(lambda: subprocess.run(
        [python, "-c", PROMOTE, str(home)], env=env, cwd=tmp_path, capture_output=True,
        text=True, timeout=60, check=False))
    assert done.returncode == 1
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("pulse_cli.gate.MissingTools: the promote gate cannot run: ")
    assert all(name in error for name in ("git is not on PATH", "mypy is not installed",
                                          "pytest is not installed", "upulse doctor"))
