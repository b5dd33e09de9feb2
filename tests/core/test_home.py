"""open_home: a home's stores from one store URL; read-only opens that write nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from pulse_core import EventDraft, HomeLayout, StoreError, open_home
from pulse_core._home import parse_store_url
from pulse_core.store import SqliteRecorder, SqliteURL


def _files(root: Path) -> dict[str, bytes]:
    """Every file under `root` (SQLite's -wal and -shm files included) and its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


async def _home_with_history(root: Path) -> None:
    stores = await open_home(root)
    await stores.events.append([EventDraft("tick", "a", {"n": 1}, attachment=b"blob")])
    await stores.vitals.record("cpu", 1)
    await stores.side.put("quiet", {"ana": b"1"})
    await stores.close()


async def test_a_read_only_home_reads_everything_and_changes_nothing(tmp_path: Path) -> None:
    await _home_with_history(tmp_path)
    before = _files(tmp_path)
    stores = await open_home(tmp_path, read_only=True)
    try:
        (event,) = await stores.events.read()
        assert event.data == {"n": 1} and event.hash is not None
        assert await stores.objects.get(event.hash) == b"blob"
        assert (await stores.vitals.latest())["cpu"].data == 1
        assert await stores.side.get_all("quiet") == {"ana": b"1"}
        with pytest.raises(StoreError, match="read-only"):
            await stores.events.append([EventDraft("tick", "b")])
        with pytest.raises(StoreError, match="read-only"):
            await stores.vitals.record("cpu", 2)
        with pytest.raises(StoreError, match="read-only"):
            await stores.side.put("quiet", {"bo": b"2"})
    finally:
        await stores.close()
    assert _files(tmp_path) == before


async def test_a_read_only_home_creates_no_missing_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no event log to read"):
        await open_home(tmp_path / "nowhere", read_only=True)
    assert not (tmp_path / "nowhere").exists()
    await _home_with_history(tmp_path)
    layout = HomeLayout.at(tmp_path)
    for path in (layout.vitals_db, layout.side_db):
        path.unlink()
    for path in sorted(layout.objects.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    layout.objects.rmdir()
    before = _files(tmp_path)
    stores = await open_home(tmp_path, read_only=True)
    try:
        assert await stores.vitals.latest() == {} and await stores.vitals.cursor() == 0
        assert await stores.side.get_all("quiet") == {}
        assert len(await stores.events.read()) == 1
    finally:
        await stores.close()
    assert _files(tmp_path) == before and not layout.objects.exists()


LOCK_HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(30)
"""


async def test_a_read_only_home_opens_beside_a_writer_without_a_writer_of_its_own(
    tmp_path: Path,
) -> None:
    await _home_with_history(tmp_path)
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LOCK_HOLDER, str(HomeLayout.at(tmp_path).events_db),
        stdout=asyncio.subprocess.PIPE)
    try:
        assert holder.stdout is not None and await holder.stdout.readline() == b"locked\n"
        before = set(threading.enumerate())  # an earlier test's threads may end meanwhile
        stores = await open_home(tmp_path, read_only=True)
        try:
            assert not [t.name for t in set(threading.enumerate()) - before
                        if "writer" in t.name]
            assert len(await stores.events.read()) == 1
        finally:
            await stores.close()
    finally:
        holder.kill()
        await holder.wait()


async def test_the_store_url_carries_the_sqlite_options(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/my%20log.db?synchronous=normal&busy_timeout=0.5"
    stores = await open_home(tmp_path / "home", store=url)
    try:
        recorder = stores.events.recorder
        assert isinstance(recorder, SqliteRecorder)
        assert recorder.path == tmp_path / "my log.db" and recorder.busy_timeout == 0.5
        await stores.events.append([EventDraft("tick", "a")])
    finally:
        await stores.close()
    assert (tmp_path / "my log.db").is_file()
    assert not (tmp_path / "home" / "events.db").exists()


def test_store_urls_round_trip_through_the_home_layout(tmp_path: Path) -> None:
    layout = HomeLayout.at(tmp_path / "odd #home? 100%")
    parsed = parse_store_url(layout.store_url())
    assert isinstance(parsed, SqliteURL)
    assert parsed.path == layout.events_db.absolute()
    assert (parsed.scheme, parsed.synchronous, parsed.busy_timeout) == ("sqlite", "FULL", 10.0)
    assert parse_store_url(parsed.url()) == parsed


@pytest.mark.parametrize("given", [0.0, 0.02])
def test_a_sqlite_url_bounds_the_inline_commit_and_keeps_it_round_trip(given: float) -> None:
    parsed = parse_store_url(f"sqlite:///srv/pulse/events.db?inline_commit={given:g}")
    assert isinstance(parsed, SqliteURL) and parsed.inline_commit == given
    assert f"inline_commit={given:g}" in parsed.url()
    assert parse_store_url(parsed.url()) == parsed


@pytest.mark.parametrize(("url", "says"), [
    ("mysql://db/pulse", "unknown scheme 'mysql'"),
    ("postgresql://db/pulse?fsync=off", "unknown option(s) fsync"),
    ("/home/me/events.db", "unknown scheme ''"),
    ("sqlite://home/me/events.db", "reads as a host"),
    ("sqlite:///", "absolute path of a file"),
    ("sqlite:relative/events.db", "absolute path of a file"),
    ("sqlite:///e.db?synchronous=SOMETIMES", "synchronous='SOMETIMES'"),
    ("sqlite:///e.db?busy_timeout=soon", "busy_timeout='soon'"),
    ("sqlite:///e.db?busy_timeout=-1", "busy_timeout='-1'"),
    ("sqlite:///e.db?journal=off", "unknown option(s) journal"),
    ("sqlite:///e.db?inline_commit=-0.1", "inline_commit='-0.1'"),
])
def test_a_store_url_that_cannot_be_used_says_why(url: str, says: str) -> None:
    with pytest.raises(StoreError) as info:
        parse_store_url(url)
    assert says in str(info.value) and repr(url) in str(info.value)


UNCLOSED = textwrap.dedent(
    """
    import asyncio, sys
    from pulse_core import EventDraft, VitalsStore, open_home

    KEPT = []  # referenced to the end, as a failed test's frames keep its stores

    async def main(home):
        stores = await open_home(home)
        KEPT.append(stores)
        await stores.events.append([EventDraft("tick", "a")])
        await stores.vitals.record("cpu", 1)
        await stores.side.put("quiet", {"ana": b"1"})
        vitals = await VitalsStore.open(home + "/other-vitals.db")
        KEPT.append(vitals)
        await vitals.record("cpu", 2)
        if sys.argv[2] == "raise":
            raise RuntimeError("ended without closing anything")

    asyncio.run(main(sys.argv[1]))
    """
)


@pytest.mark.parametrize("ending", ["return", "raise"])
async def test_a_program_that_never_closes_its_stores_still_exits(
    tmp_path: Path, ending: str
) -> None:
    child = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", UNCLOSED, str(tmp_path), ending],
        check=False, capture_output=True, text=True, timeout=30)
    assert child.returncode == (0 if ending == "return" else 1), child.stderr
    stores = await open_home(tmp_path, read_only=True)
    try:
        assert len(await stores.events.read()) == 1  # acknowledged, so stored
    finally:
        await stores.close()
