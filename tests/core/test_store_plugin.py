"""Store backends are plug-ins: a third backend (tests/memory_store.py), registered through an
entry point of a distribution of its own, passes the store contract suite unchanged and
serves a home's log and side state; a scheme no backend serves, a backend that cannot be
imported and a scheme claimed twice are typed errors that say what to install or
uninstall."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pulse_core import EventDraft, ManualClock, StoreBackendMissing, StoreError, open_home
from pulse_core.store import (
    Recorder,
    parse_side_store_url,
    parse_store_url,
    side_store_schemes,
    store_schemes,
)
from tests.conftest import installed_distribution
from tests.core.store_contract import RecorderContract


@pytest.mark.usefixtures("memory_backend")
class TestMemoryRecorder(RecorderContract):
    @pytest.fixture(autouse=True)
    def _prefix(self, tmp_path: Path) -> None:
        self.prefix = tmp_path.name  # a log of this test's own

    async def open_recorder(self, name: str = "events", *, read_only: bool = False) -> Recorder:
        location = parse_store_url(f"memory://{self.prefix}-{name}")
        return await location.open(read_only=read_only, clock=None)


def test_pulse_s_own_backends_are_found_through_entry_points_like_any_other() -> None:
    assert {"sqlite", "postgresql", "postgres"} <= set(store_schemes())
    assert {"sqlite", "redis", "rediss", "valkey", "valkeys"} <= set(side_store_schemes())


def test_a_scheme_no_installed_backend_serves_is_refused_listing_what_is_installed() -> None:
    with pytest.raises(StoreBackendMissing) as info:
        parse_store_url("memory://main")
    said = str(info.value)
    assert "unknown scheme 'memory'" in said
    assert "(installed: postgres://, postgresql://, sqlite://)" in said
    assert "entry-point group 'pulse.stores'" in said
    with pytest.raises(StoreBackendMissing, match=r"entry-point group 'pulse\.side_stores'"):
        parse_side_store_url("memcached://127.0.0.1")


@pytest.mark.usefixtures("memory_backend")
def test_an_installed_backend_s_scheme_is_listed_and_read_by_its_own_function() -> None:
    assert "memory" in store_schemes()
    location = parse_store_url("memory://main")
    assert (location.backend, location.display(), location.file) == (
        "memory", "memory://main", None)
    with pytest.raises(StoreError, match="name the log"):
        parse_store_url("memory://")


@pytest.mark.usefixtures("memory_backend")
async def test_a_home_runs_on_the_third_backend(tmp_path: Path) -> None:
    stores = await open_home(tmp_path / "home", store="memory://home")
    try:
        done = await stores.events.append([EventDraft("tick", "a", {"n": 1}, origin="agent")])
        assert done.events[0].seq == 1
        assert type(stores.events.recorder).__module__ == "tests.memory_store"
    finally:
        await stores.close()
    assert not (tmp_path / "home" / "events.db").exists()  # the log is not SQLite's
    reader = await open_home(tmp_path / "home", store="memory://home", read_only=True)
    try:
        assert [e.data for e in await reader.events.read()] == [{"n": 1}]
    finally:
        await reader.close()


@pytest.mark.usefixtures("memory_backend")
async def test_a_home_keeps_its_side_state_in_a_third_side_store_backend(tmp_path: Path) -> None:
    clock = ManualClock(1_000)
    stores = await open_home(tmp_path / "home", side_store="memory://hold", clock=clock)
    try:
        await stores.side.put("quiet", {"ana": b"1"}, ttl_ms=500)
        assert type(stores.side).__module__ == "tests.memory_store"
    finally:
        await stores.close()
    assert not (tmp_path / "home" / "state.db").exists()
    again = await open_home(tmp_path / "home", side_store="memory://hold", clock=clock,
                            read_only=True)
    try:
        assert await again.side.get_all("quiet") == {"ana": b"1"}
        clock.advance(500)
        assert await again.side.get_all("quiet") == {}
    finally:
        await again.close()


def test_a_backend_that_cannot_be_imported_names_the_distribution_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed_distribution(tmp_path, "pulse-cloud-store",
                           "[pulse.stores]\ncloud = pulse_cloud_driver.store:parse\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(StoreBackendMissing) as info:
        parse_store_url("cloud://bucket/log")
    said = str(info.value)
    assert "store backend 'cloud' (pulse_cloud_driver.store:parse" in said
    assert "No module named 'pulse_cloud_driver'" in said
    assert "pip install 'pulse-cloud-store'" in said


def test_a_scheme_claimed_by_two_distributions_is_refused_naming_both(
        memory_backend: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    installed_distribution(tmp_path, "pulse-other-memory",
                           "[pulse.stores]\nmemory = other_memory:parse\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(StoreBackendMissing, match="served by several backends") as info:
        parse_store_url("memory://main")
    assert "tests.memory_store:parse_memory_url" in str(info.value)
    assert "other_memory:parse" in str(info.value)


def test_an_entry_point_that_reads_no_location_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed_distribution(tmp_path, "pulse-odd-store", "[pulse.stores]\nodd = builtins:str\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(StoreError, match=r"'odd' \(builtins:str\) returned str, not a "
                                         "LogLocation"):
        parse_store_url("odd://x")


IMPORTS = textwrap.dedent("""
    import sys
    from pulse_core.store import parse_store_url, parse_side_store_url
    parse_store_url("postgresql://h/db")
    parse_side_store_url("redis://h:6379/0")
    print(sorted(m for m in ("psycopg", "redis") if m in sys.modules))
""")


def test_a_side_store_url_read_by_its_backend_never_shows_its_password() -> None:
    location = parse_side_store_url("redis://ana:s3cret@cache.example:6380/2")
    for text in (repr(location), str(location), location.display(), repr([location])):
        assert "s3cret" not in text and "cache.example:6380/2" in text


def test_reading_a_server_s_url_loads_no_driver() -> None:
    done = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"
