"""The SQLite recorder: the store contract, plus what only a SQLite file can show."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import threading
from pathlib import Path

import pytest

from bench.disk import WriteGate
from pulse_core import (
    EventDraft,
    NotAPulseDatabase,
    ObjectMissing,
    ObjectStore,
    SchemaTooNew,
    SqliteEventStore,
    StoreError,
    VersionConflict,
)
from pulse_core.store import EventStore, Recorder, SqliteRecorder
from tests.core.store_contract import RecorderContract, draft
from tests.timing import LoopTurns


class TestSqliteRecorder(RecorderContract):
    @pytest.fixture(autouse=True)
    def _folder(self, tmp_path: Path) -> None:
        self.folder = tmp_path

    async def open_recorder(self, name: str = "events", *, read_only: bool = False) -> Recorder:
        return await SqliteRecorder.open(self.folder / f"{name}.db", read_only=read_only)


async def test_update_and_delete_are_refused_by_the_database(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    await store.append([draft("a", 1)])
    await store.close()
    conn = sqlite3.connect(tmp_path / "events.db")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE events SET data = x'00'")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM events")
    assert conn.execute("SELECT count(*) FROM events").fetchone() == (1,)


async def test_a_file_that_is_not_sqlite_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    path.write_bytes(b"definitely not a database" * 100)
    with pytest.raises(NotAPulseDatabase, match=str(path)):
        await SqliteEventStore.open(path)
    assert path.read_bytes() == b"definitely not a database" * 100


async def test_another_programs_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(NotAPulseDatabase, match="another program"):
        await SqliteEventStore.open(path)


async def test_a_schema_from_a_newer_pulse_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    store = await SqliteEventStore.open(path)
    await store.append([draft("a")])
    await store.close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=99")
    conn.close()
    with pytest.raises(SchemaTooNew, match="upgrade pulse"):
        await SqliteEventStore.open(path)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM events").fetchone() == (1,)


async def test_a_corrupted_database_gives_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    store = await SqliteEventStore.open(path)
    await store.append([draft(str(i)) for i in range(2000)])
    await store.close()
    raw = bytearray(path.read_bytes())
    for offset in range(4096, len(raw), 4096):  # trash every page after the header page
        raw[offset + 8 : offset + 64] = b"\xff" * 56
    path.write_bytes(bytes(raw))
    with pytest.raises(NotAPulseDatabase):
        reopened = await SqliteEventStore.open(path)
        try:
            await reopened.read()
        finally:
            await reopened.close()


async def test_attachments_go_to_objects_and_deleting_bytes_keeps_the_record(
        tmp_path: Path) -> None:
    objects = ObjectStore(tmp_path / "objects")
    store = await SqliteEventStore.open(tmp_path / "events.db", objects=objects)
    blob = b"x" * 100_000
    first = await store.append([EventDraft("tick", "big", {"n": 1}, attachment=blob)])
    second = await store.append([EventDraft("tick", "big2", {"n": 2}, attachment=blob)])
    digest = first.events[0].hash
    assert digest is not None and digest == second.events[0].hash
    assert await objects.get(digest) == blob
    assert sum(1 for p in (tmp_path / "objects").rglob("*") if p.is_file()) == 1
    assert objects.delete_sync(digest)  # a governed purge: RetentionLadder.purge_payload
    with pytest.raises(ObjectMissing, match=digest):
        await objects.get(digest)
    stored = await store.read(key="big")
    assert stored[0].hash == digest and stored[0].data == {"n": 1}
    assert not objects.delete_sync(digest)
    await store.close()


APPEND_AND_CLOSE = """
import asyncio, sys
from pulse_core import EventDraft, SqliteEventStore

async def main():
    store = await SqliteEventStore.open(sys.argv[1])
    await store.append([EventDraft("tick", "b", {"n": 2})])
    await store.close()

asyncio.run(main())
"""


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_a_read_only_log_creates_no_file_and_follows_writers_that_come_and_go(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.db"
    writer = await SqliteEventStore.open(path)
    await writer.append([draft("a", 1)])
    await writer.close()
    assert _names(tmp_path) == ["events.db"]
    reader = await SqliteEventStore.open(path, read_only=True)
    try:
        assert [e.key for e in await reader.read()] == ["a"]
        assert _names(tmp_path) == ["events.db"]
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", APPEND_AND_CLOSE, str(path))
        assert await child.wait() == 0
        assert [e.key for e in await reader.read()] == ["a", "b"]
        live = await SqliteEventStore.open(path)
        await live.append([draft("c", 3)])
        assert [e.key for e in await reader.read()] == ["a", "b", "c"]
        assert await reader.last_seq() == 3 and await reader.head("c") == 1
        await live.close()
    finally:
        await reader.close()


async def test_a_sqlite_store_holds_each_exclusive_name_once_and_does_not_listen(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    inside: list[str] = []
    most = 0

    async def holder(name: str) -> None:
        nonlocal most
        async with store.exclusive(name):
            inside.append(name)
            most = max(most, inside.count(name))
            await asyncio.sleep(0.001)
            inside.remove(name)

    try:
        await asyncio.gather(*(holder(name) for name in ("a", "b") * 5))
        assert most == 1
        assert store.recorder.listen(lambda: None) is False
        store.subscribe()
        assert store.wakes_across_processes is False  # so executor loops read at every wake
    finally:
        await store.close()


class CommitClock:
    """A clock read once per commit (the stamp of its rows) that moves on at every reading:
    the distinct stamps in a log are its commits."""

    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def now_ms(self) -> int:
        self.ms += 1
        return self.ms


@pytest.mark.parametrize("inline_commit", [0.005, 0.0])
async def test_concurrent_appends_share_commits_and_a_lone_one_leaves_the_loop_turning(
    tmp_path: Path, inline_commit: float
) -> None:
    """32 coroutines appending at once go to the writer thread in groups (fewer commits than
    appends); a coroutine appending alone, over and over, commits each (on the loop, unless
    inline_commit is 0) and still lets the other coroutines run between its appends."""
    clock = CommitClock()
    recorder = await SqliteRecorder.open(tmp_path / "events.db", clock=clock,
                                         inline_commit=inline_commit)
    store = EventStore(recorder)
    try:
        await asyncio.gather(*(store.append([draft(f"k{i}")]) for i in range(32)))
        grouped = {e.ts for e in await store.read()}
        assert len(grouped) < 32, "32 concurrent appends made 32 commits"

        async with LoopTurns() as loop:
            for i in range(20):
                seen = loop.turns
                await store.append([draft("lone", i)])
                assert loop.turns > seen, f"append {i} ran without letting another coroutine run"
        lone = [e for e in await store.read() if e.key == "lone"]
        assert [e.version for e in lone] == list(range(1, 21))
        assert len({e.ts for e in lone}) == 20  # one commit each
    finally:
        await store.close()


async def test_a_coroutine_appending_alone_without_pause_still_lets_timers_fire(
        tmp_path: Path) -> None:
    """A lone append committed while the loop's thread waits need not suspend for its
    commit; a coroutine appending over and over still lets the loop turn before each, so a
    timer (the tick, a watcher's interval) fires meanwhile."""
    store = await SqliteEventStore.open(tmp_path / "events.db", inline_commit=1.0)
    try:
        async with LoopTurns(every=0.001) as timer:
            for i in range(300):
                await store.append([draft("lone", i)])
        assert timer.turns >= 3, f"a timer fired {timer.turns} times over 300 appends"
    finally:
        await store.close()


async def test_a_lone_append_whose_commit_meets_a_stalled_disk_leaves_the_loop_turning(
    tmp_path: Path
) -> None:
    """A lone append whose COMMIT waits for the disk holds the loop at most inline_commit:
    the loop goes on while the write waits, the append returns once the disk lets it through,
    and the appends after it are stored in order."""
    if not WriteGate.available():
        pytest.skip("SQLite's write hooks cannot be reached through ctypes here")
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        await store.append([draft("k", 0)])  # a quick commit first: the next one is lone
        with WriteGate() as gate:
            # Only if the loop itself were stuck in the write would this open the gate.
            rescue = threading.Timer(60, gate.open)
            rescue.start()
            try:
                gate.shut()
                waiting = asyncio.create_task(store.append([draft("k", 1)]))
                # Awaiting a thread needs the loop to turn while the commit waits.
                assert await asyncio.to_thread(gate.held.wait, 60)
                assert gate.is_shut, "the loop stood still until the disk came back"
                assert not waiting.done()
                gate.open()
                result = await waiting
            finally:
                rescue.cancel()
        assert [e.version for e in result.events] == [2]
        for n in range(2, 5):
            await store.append([draft("k", n)])
        assert [e.version for e in await store.read()] == [1, 2, 3, 4, 5]
    finally:
        await store.close()


async def test_appends_of_every_size_store_each_row_and_move_each_head(tmp_path: Path) -> None:
    """Rows are written as a few multi-row statements (64, 16, 4, 1 rows): every size around
    those, keys repeated inside an append, stores each row once, gap-free and in draft order,
    and leaves each key's head at its last version, as a new writer reads it from the file."""
    store = await SqliteEventStore.open(tmp_path / "events.db")
    sizes = [1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 85, 100, 129, 300]
    try:
        n = 0
        for size in sizes:
            drafts = [draft(f"k{(n + i) % 97}", n + i) for i in range(size)]
            result = await store.append(drafts)
            assert [e.data["n"] for e in result.events] == list(range(n, n + size))
            n += size
        stored = await store.read()
        assert [e.seq for e in stored] == list(range(1, n + 1))
        assert [e.data["n"] for e in stored] == list(range(n))
        versions: dict[str, int] = {}
        for event in stored:
            versions[event.key] = versions.get(event.key, 0) + 1
            assert event.version == versions[event.key], event
        assert {key: await store.head(key) for key in versions} == versions
    finally:
        await store.close()
    store = await SqliteEventStore.open(tmp_path / "events.db")  # knows no version yet
    try:
        result = await store.append([draft(key, 0) for key in versions], expect=versions)
        assert [e.version for e in result.events] == [v + 1 for v in versions.values()]
    finally:
        await store.close()


async def test_a_writer_that_found_the_log_empty_versions_keys_right_past_what_it_keeps(
    tmp_path: Path
) -> None:
    """A writer that found the log empty knows every key's version without reading it; once
    more keys were written than it keeps in memory, or another writer wrote, a key it no
    longer holds is read from the file again, never taken for a new one."""
    store = await SqliteEventStore.open(tmp_path / "events.db")
    other = await SqliteEventStore.open(tmp_path / "events.db")  # as another process would
    try:
        assert [e.version for e in (await store.append([draft("old", 0)])).events] == [1]
        many = await store.append([draft(f"k{i}", i) for i in range(17_000)])
        assert {e.version for e in many.events} == {1}
        again = await store.append([draft("old", 1)], expect={"old": 1})
        assert [e.version for e in again.events] == [2]
        await other.append([draft("theirs", 0)])
        mine = await store.append([draft("theirs", 1)], expect={"theirs": 1})
        assert [e.version for e in mine.events] == [2]
    finally:
        await other.close()
        await store.close()


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
async def test_a_negative_inline_bound_is_refused_naming_the_option(
    tmp_path: Path, bad: float
) -> None:
    with pytest.raises(ValueError, match="inline_commit"):
        SqliteRecorder(tmp_path / "events.db", inline_commit=bad)
    assert not (tmp_path / "events.db").exists()


# -- schema 2: the kind index, added to existing homes ---------------------------------------


async def _schema_1_home(path: Path, events: int) -> list[tuple[object, ...]]:
    """An events.db as pulse with schema 1 left it (no events_kind index), and its rows."""
    store = await SqliteEventStore.open(path)
    await store.append([draft(f"k{n % 7}", n, kind="tick" if n % 50 else "error")
                        for n in range(events)])
    await store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("DROP INDEX events_kind")
        conn.execute("PRAGMA user_version=1")
        return conn.execute("SELECT * FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()


def _schema(path: Path) -> tuple[int, set[str]]:
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        return version, names
    finally:
        conn.close()


async def test_a_schema_1_home_is_upgraded_when_the_writer_opens_it_and_keeps_every_event(
        tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    rows = await _schema_1_home(path, 500)
    assert _schema(path) == (1, {"events_idem", "events_key"})
    reader = await SqliteEventStore.open(path, read_only=True)  # a reader changes nothing
    try:
        assert [e.seq for e in await reader.read(kinds=["error"], newest_first=True,
                                                 limit=3)] == [451, 401, 351]
    finally:
        await reader.close()
    assert _schema(path)[0] == 1
    store = await SqliteEventStore.open(path)
    try:
        assert _schema(path) == (3, {"events_idem", "events_key", "events_kind"})
        errors = await store.read(kinds=["error"], newest_first=True, limit=3)
        assert [e.seq for e in errors] == [451, 401, 351]
        # the upgraded log goes on where it was
        stored = await store.append([draft("k0", 500)], expect={"k0": 72})
        assert [(e.seq, e.version) for e in stored.events] == [(501, 73)]
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT * FROM events WHERE seq <= 500 ORDER BY seq").fetchall() \
            == rows
        plan = " ".join(str(r[3]) for r in conn.execute(
            "EXPLAIN QUERY PLAN SELECT seq FROM events WHERE seq > 0 AND kind IN ('error') "
            "ORDER BY seq DESC LIMIT 100"))
        assert "events_kind" in plan
    finally:
        conn.close()
    again = await SqliteEventStore.open(path)  # opened again: nothing left to do
    await again.close()
    assert _schema(path)[0] == 3


async def test_a_schema_2_home_loses_its_heads_table_and_its_keys_keep_their_versions(
        tmp_path: Path) -> None:
    """Schema 3 reads a key's version from its newest event: the `heads` table a schema-2
    log kept beside its events is dropped, and every key goes on from its version."""
    path = tmp_path / "events.db"
    store = await SqliteEventStore.open(path)
    await store.append([draft(f"k{n % 3}", n) for n in range(10)])
    await store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:  # as pulse with schema 2 left it
        conn.execute("CREATE TABLE heads (key TEXT PRIMARY KEY, version INTEGER NOT NULL) "
                     "WITHOUT ROWID")
        conn.execute("INSERT INTO heads SELECT key, max(version) FROM events GROUP BY key")
        conn.execute("PRAGMA user_version=2")
    finally:
        conn.close()
    store = await SqliteEventStore.open(path)
    try:
        assert [await store.head(k) for k in ("k0", "k1", "k2", "k3")] == [4, 3, 3, 0]
        with pytest.raises(VersionConflict):
            await store.append([draft("k1", 10)], expect={"k1": 2})
        stored = await store.append([draft("k1", 10), draft("k3", 11)], expect={"k1": 3})
        assert [e.version for e in stored.events] == [4, 1]
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'heads'"
                            ).fetchone()[0] == 0
    finally:
        conn.close()


def test_an_upgrade_that_fails_changes_nothing_and_names_the_file(tmp_path: Path) -> None:
    from pulse_core.store._sqlite import open_database
    from pulse_core.store._sqlite_recorder import SCHEMA

    path = tmp_path / "events.db"
    rows = asyncio.run(_schema_1_home(path, 20))
    with pytest.raises(StoreError, match=r"events\.db: no such table"):
        open_database(path, schema=SCHEMA, schema_version=2, synchronous="FULL",
                      purpose="event log", upgrades={1: (
                          "CREATE INDEX events_kind ON events(kind, seq)",
                          "CREATE INDEX broken ON no_such_table(x)")})
    assert _schema(path) == (1, {"events_idem", "events_key"})
    with pytest.raises(StoreError, match=r"no upgrade from schema 1 to 3"):
        open_database(path, schema=SCHEMA, schema_version=3, synchronous="FULL",
                      purpose="event log", upgrades={2: ()})
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT * FROM events ORDER BY seq").fetchall() == rows
    finally:
        conn.close()
