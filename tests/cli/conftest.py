"""Fixtures of the pulse_cli tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.runner import Upulse
from tests.cli.support import ROOT


@pytest.fixture(scope="session", autouse=True)
def shared_mypy_cache() -> Iterator[None]:
    """Gate runs share one mypy cache, so only the first checks pulse_core from cold."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MYPY_CACHE_DIR", str(ROOT / ".mypy_cache" / "engine-gate"))
        yield


@pytest.fixture
def upulse(tmp_path: Path) -> Iterator[Upulse]:
    """`upulse` as a subprocess on throwaway homes; daemons it left running are stopped
    (or killed) afterwards."""
    runner = Upulse(tmp_path)
    try:
        yield runner
    finally:
        runner.stop_all()
