"""The MCP tests' fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.runner import Upulse


@pytest.fixture
def upulse(tmp_path: Path) -> Iterator[Upulse]:
    """`upulse` as a subprocess on throwaway homes."""
    runner = Upulse(tmp_path)
    try:
        yield runner
    finally:
        runner.stop_all()
