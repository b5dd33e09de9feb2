"""Fixtures of the whole-process tests: child processes that never outlive a test, and a
hard time limit per test so nothing can hang the suite."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest

from .support import Child

TEST_TIME_LIMIT_S = 30


class TimeLimitExceeded(Exception):
    """A whole-process test ran past its hard limit."""


@pytest.fixture(autouse=True)
def time_box() -> Iterator[None]:
    """Fail (rather than hang) a test that runs past TEST_TIME_LIMIT_S."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeLimitExceeded(f"test ran past its {TEST_TIME_LIMIT_S} s limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIME_LIMIT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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
