"""Fixtures for every test: a hard time limit, so nothing can hang the suite (scaled by
PULSE_TEST_SLOWNESS, tests/timing.py); real PostgreSQL and Redis servers on loopback for the
tests that need them (tests/servers.py). Hypothesis runs without a per-example deadline: the
time limit bounds a hang, and a loaded machine's pauses are not the code's."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest
from hypothesis import settings

from tests.e2e.support import Child
from tests.servers import PostgresServer, RedisServer
from tests.timing import scaled

settings.register_profile("pulse", deadline=None)
settings.load_profile("pulse")

DEFAULT_TIME_LIMIT_S = 60
ROOT = Path(__file__).resolve().parents[1]


class TimeLimitExceeded(Exception):
    """A test ran past its hard limit."""


@pytest.fixture(autouse=True)
def time_box(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail (rather than hang) a test that runs past its module's TEST_TIME_LIMIT_S, scaled."""
    limit = scaled(getattr(request.module, "TEST_TIME_LIMIT_S", DEFAULT_TIME_LIMIT_S))

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeLimitExceeded(f"test ran past its {limit:g} s limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL cluster on 127.0.0.1 for the whole run (fsync off: tests, not
    durability, are measured here)."""
    root = Path(tempfile.mkdtemp(prefix="pulse-pg-"))
    server = PostgresServer(root).init()
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def restartable(postgres_server: PostgresServer) -> Iterator[PostgresServer]:
    """The session's PostgreSQL, for a test that stops or restarts it: running again
    afterwards, whatever happened (other tests share it)."""
    yield postgres_server
    try:
        postgres_server.sql("SELECT 1")
    except subprocess.SubprocessError:  # psql could not connect: the server is down
        postgres_server.start()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL on each backend, which every engine and host of a test may share: an
    events.db in `tmp_path`, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'events.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def spawn_host(tmp_path: Path) -> Iterator[Callable[..., Child]]:
    """Start engine host processes (tests/fleet/engine_host.py); each still running at the
    end of the test is killed."""
    from tests.fleet.fleet_support import host_processes

    with host_processes(tmp_path) as start:
        yield start


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> str:
    """The URL of a new, empty PostgreSQL database of its own."""
    return postgres_server.create_database()


@pytest.fixture
def restore_redis(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The session's redis-server, running again after the test whatever it did to it."""
    yield redis_server
    if redis_server.process is None:
        redis_server.start()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server on 127.0.0.1 for the whole run."""
    root = Path(tempfile.mkdtemp(prefix="pulse-redis-"))
    server = RedisServer(root).start()
    try:
        yield server
    finally:
        server.kill()
        shutil.rmtree(root, ignore_errors=True)


def installed_distribution(site: Path, name: str, entry_points: str) -> None:
    """The metadata of an installed distribution `name` in the folder `site` (a .dist-info
    with its METADATA and entry_points.txt), as pip leaves it: what importlib.metadata
    reads entry points from."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def memory_backend(tmp_path_factory: pytest.TempPathFactory,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The example third store backend (tests/memory_store.py, scheme memory:// for event
    logs and side stores) installed as its own distribution, `pulse-memory-store`, in a
    folder on sys.path (and on PYTHONPATH, for child processes); the folder."""
    import tests.memory_store

    site = tmp_path_factory.mktemp("site-packages")
    installed_distribution(site, "pulse-memory-store",
                           "[pulse.stores]\nmemory = tests.memory_store:parse_memory_url\n"
                           "[pulse.side_stores]\n"
                           "memory = tests.memory_store:parse_memory_side_url\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(site), str(ROOT), os.environ.get("PYTHONPATH")])))
    yield site
    tests.memory_store.LOGS.clear()
    tests.memory_store.SIDES.clear()
