"""Fixtures of the whole-process tests: child processes that never outlive a test (the hard
time limit per test is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .support import Child


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Child]]:
    """Start a child script; every child still running at the end of the test is killed."""
    children: list[Child] = []

    def start(script: str, *args: str | Path) -> Child:
        child = Child(script, [str(a) for a in args], tmp_path)
        children.append(child)
        return child

    yield start
    for child in children:
        child.close()
