"""The hypothesis properties of the log (tests/core/test_properties.py) against PostgreSQL:
concurrent appends gap-free with versions, idempotency as the first write decides, and an
incremental fold with checkpoints equal to a replay. Each example gets a schema of its own
in one database of the session's server."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_core import EventStore
from pulse_core.store import open_event_store
from tests.core.test_properties import (
    KEYS,
    Opener,
    idempotency_scenario,
    interleaving_scenario,
    projection_scenario,
    step,
)
from tests.servers import PostgresServer

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
_examples = itertools.count()


@pytest.fixture(scope="module")
def database(postgres_server: PostgresServer) -> str:
    """One database for this module; each example opens a fresh schema in it."""
    return postgres_server.create_database()


def opener(database: str) -> Opener:
    async def open_store(folder: Path) -> EventStore:
        return await open_event_store(f"{database}?schema=p{next(_examples)}")
    return open_store


def run(scenario: Any, database: str, *args: Any) -> None:
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(opener(database), Path(folder), *args))


@SETTINGS
@given(steps=st.lists(step, max_size=25), every=st.integers(1, 7))
def test_incremental_projection_with_checkpoints_and_restarts_equals_replay(
    database: str, steps: list[tuple[str, Any]], every: int
) -> None:
    run(projection_scenario, database, steps, every)


@SETTINGS
@given(scripts=st.lists(st.lists(st.lists(KEYS, min_size=1, max_size=5), max_size=6),
                        min_size=1, max_size=8),
       pauses=st.lists(st.integers(0, 2), min_size=1, max_size=10))
def test_any_interleaving_of_appends_gives_gap_free_seq_and_versions(
    database: str, scripts: list[list[list[str]]], pauses: list[int]
) -> None:
    run(interleaving_scenario, database, scripts, pauses)


@SETTINGS
@given(requests=st.lists(st.tuples(st.sampled_from(["r1", "r2", "r3"]), KEYS,
                                   st.integers(0, 2), st.booleans()), min_size=1, max_size=20))
def test_idempotency_replays_or_conflicts_exactly_as_the_first_write_decides(
    database: str, requests: list[tuple[str, str, int, bool]]
) -> None:
    run(idempotency_scenario, database, requests)
