"""The backends the maintenance layer's tests run on: a SQLite file and a database of its own
on a real PostgreSQL server on loopback (tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from pulse_core import Clock, EventStore, HomeLayout
from pulse_core.store import open_event_store

BACKENDS = ("sqlite", "postgresql")

OpenStore = Callable[..., Awaitable[EventStore]]
"""open_store(clock=None, read_only=False): the test's store, opened again on every call."""


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty store on each backend: the events.db of `tmp_path` as a home, or
    a new PostgreSQL database."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("pg_url")
        return url
    return HomeLayout.at(tmp_path).store_url()


@pytest.fixture
def open_store(store_url: str) -> OpenStore:
    """Opens the test's store (each backend in turn)."""
    async def opener(clock: Clock | None = None, *, read_only: bool = False) -> EventStore:
        return await open_event_store(store_url, clock=clock, read_only=read_only)
    return opener
