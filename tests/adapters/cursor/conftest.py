"""Fixtures of the cursor tests: the stand-in `agent` executable and a repository folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adapters.cursor.stand_in import StandIn


@pytest.fixture
def stand_in(tmp_path: Path) -> StandIn:
    """The stand-in `agent`, installed in the test's folder, behaving as "success"."""
    return StandIn.install(tmp_path / "bin")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository folder for the agent to work in."""
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "README.md").write_text("hello\n", encoding="utf-8")
    return folder
