"""Fixtures for every test: a hard time limit, so nothing can hang the suite."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import FrameType

import pytest

DEFAULT_TIME_LIMIT_S = 60


class TimeLimitExceeded(Exception):
    """A test ran past its hard limit."""


@pytest.fixture(autouse=True)
def time_box(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail (rather than hang) a test that runs past its module's TEST_TIME_LIMIT_S."""
    limit = getattr(request.module, "TEST_TIME_LIMIT_S", DEFAULT_TIME_LIMIT_S)

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeLimitExceeded(f"test ran past its {limit} s limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
