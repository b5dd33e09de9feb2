"""`upulse migrate --to URL`: a home's log copied into an empty log of any store backend
exactly, verified, switched only when asked; real SQLite homes, a real PostgreSQL server on
127.0.0.1, and a third backend registered through an entry point (tests/memory_store.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pulse_cli.config import write_default
from pulse_cli.home import Home
from pulse_cli.migrate import MIGRATION_LOCK, MigrationInProgress, _copy, migrate
from pulse_cli.migrate_verify import verify_copy
from pulse_cli.output import Progress
from pulse_core import EventDraft, EventStore, SqliteEventStore, TaskBoard, open_home
from pulse_core._effects import effect_draft
from pulse_core.store import StoredRow, open_event_store
from pulse_survival import RestartProcess
from tests import memory_store
from tests.cli.runner import Upulse
from tests.cli.test_postgres_home import unreachable
from tests.servers import PostgresServer

TEST_TIME_LIMIT_S = 120  # one test starts a real daemon; one copies 12,000 events


async def fill(home: Path, *, notes: int = 0) -> None:
    """A log with tasks, an event with an attachment (its `hash` set), `notes` more events,
    and then a row whose data cannot be decoded (as a corrupt disk leaves one)."""
    stores = await open_home(home)
    store = stores.events
    try:
        board = TaskBoard(store, origin="agent")
        await board.create("t-1", "summarise the inbox")
        await store.append([EventDraft("notification", "report", {"text": "attached"},
                                       origin="agent", attachment=b"%PDF-1.7 a report")])
        for start in range(0, notes, 1_000):
            await store.append([EventDraft("notification", f"n-{n % 50}", {"n": n},
                                           origin="agent", idem=f"note-{n}")
                                for n in range(start, min(start + 1_000, notes))])
    finally:
        await stores.close()
    unreadable_row(home / "events.db", key="t-9")


def unreadable_row(db: Path, key: str) -> None:
    """A stored row of `key` whose data is not JSON, with the seq and version it would get."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        seq = conn.execute("SELECT coalesce(max(seq), 0) + 1 FROM events").fetchone()[0]
        conn.execute("INSERT INTO events VALUES (?, ?, 'notification', ?, 1, 1700000000000, "
                     "'agent', NULL, 'tx-corrupt', NULL, ?, NULL)",
                     (seq, f"id-corrupt-{seq}", key, b"\xff\xfe not json"))
        conn.execute("COMMIT")
    finally:
        conn.close()


async def all_rows(store: EventStore) -> list[StoredRow]:
    return await store.recorder.rows(0, 1_000_000)


async def rows_at(url: str) -> list[StoredRow]:
    store = await open_event_store(url, read_only=True)
    try:
        return await all_rows(store)
    finally:
        await store.close()


def fingerprint(home: Path) -> dict[str, str]:
    """The SHA-256 of every file of the home (but the lock, which names its last holder)."""
    return {str(p.relative_to(home)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(home.rglob("*")) if p.is_file() and p.name != "engine.lock"}


def migrated(upulse: Upulse, home: Path, url: str, *extra: str) -> dict[str, Any]:
    report = upulse.json("migrate", "--home", home, "--to", url, *extra)
    assert isinstance(report, dict)
    return report


def database(url: str) -> str:
    return url.rsplit("/", 1)[1]


async def test_migrate_copies_every_row_exactly_verifies_it_and_leaves_the_home_as_it_was(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    home = upulse.init(tmp_path / "home")
    await fill(home, notes=30)
    before = fingerprint(home)
    source = await SqliteEventStore.open(home / "events.db", read_only=True)
    try:
        ours = await all_rows(source)
    finally:
        await source.close()
    report = migrated(upulse, home, pg_url)
    assert report["verified"] is True and report["switched"] is False
    assert (report["events"], report["keys"], report["mismatches"]) == (len(ours), 33, [])
    theirs = await rows_at(pg_url)
    assert theirs == ours  # every field: seq, id, kind, key, version, ts, ..., data, hash
    assert [r.seq for r in theirs] == list(range(1, len(ours) + 1))
    attached = next(r for r in theirs if r.key == "report")
    assert attached.hash is not None and attached.data == next(
        r for r in ours if r.key == "report").data
    assert theirs[-1].data == b"\xff\xfe not json"  # the unreadable row, byte for byte
    assert fingerprint(home) == before
    assert json.loads((home / "config.json").read_text())["store"] is None


async def test_migrate_with_switch_makes_postgresql_the_homes_log_and_appends_continue_it(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    home = upulse.init(tmp_path / "home")
    await fill(home)
    report = migrated(upulse, home, pg_url, "--switch")
    assert report["verified"] is True and report["switched"] is True
    config = json.loads((home / "config.json").read_text())
    assert config["store"] == pg_url and config["default_tick_ms"] == 200  # the rest kept
    listed = upulse.json("events", "--home", home)
    assert isinstance(listed, list) and len(listed) == report["events"]
    moved = upulse("task", "assign", "t-1", "ada", "--home", home).stdout
    assert f"(event #{report['events'] + 1}, version 2)" in moved
    assert len(await rows_at(pg_url)) == report["events"] + 1
    source = await SqliteEventStore.open(home / "events.db", read_only=True)
    try:
        assert await source.last_seq() == report["events"]  # the old log is kept as it was
    finally:
        await source.close()


async def test_migrate_refuses_a_target_that_holds_events_naming_it_and_the_count(
        upulse: Upulse, tmp_path: Path, pg_url: str, postgres_server: PostgresServer) -> None:
    home = upulse.init(tmp_path / "home")
    await fill(home)
    other = upulse.init(tmp_path / "other")
    await fill(other)
    migrated(upulse, other, pg_url)
    done = upulse("migrate", "--home", home, "--to", pg_url, "--switch", ok=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert (f"postgresql://127.0.0.1:{postgres_server.port}/{database(pg_url)} already holds "
            "3 event(s) (seq 1 to 3) — migrate copies into an empty log only") in done.stderr
    assert json.loads((home / "config.json").read_text())["store"] is None


async def test_migrate_refuses_while_the_daemon_runs_on_the_home(
        upulse: Upulse, tmp_path: Path, pg_url: str, postgres_server: PostgresServer) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("daemon", "start", "--home", home)
    done = upulse("migrate", "--home", home, "--to", pg_url, ok=False)
    assert done.returncode == 3 and done.stderr.count("\n") == 1
    assert "migrate refused: the daemon (pid" in done.stderr
    assert "`upulse daemon stop` first" in done.stderr
    assert postgres_server.sql("SELECT count(*) FROM information_schema.schemata WHERE "
                               "schema_name = 'pulse'", database(pg_url)) == "0"
    upulse("daemon", "stop", "--home", home)
    assert migrated(upulse, home, pg_url)["verified"] is True


async def test_migrate_streams_a_big_log_in_pages_and_reports_progress(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    home = upulse.init(tmp_path / "home")
    await fill(home, notes=12_000)
    done = upulse("migrate", "--home", home, "--to", pg_url, "--page", "500", timeout=90)
    total = 12_003
    assert f"copying {total} events from sqlite://{home}/events.db to " in done.stderr
    assert f"copied {total}/{total} events (100%)" in done.stderr
    assert f"verified {total}/{total} events" in done.stderr
    assert done.stdout.startswith(f"verified: {total} events and 53 keys in postgresql://")
    assert "not switched:" in done.stdout and "--switch" in done.stdout
    assert len(await rows_at(pg_url)) == total


async def test_verification_names_each_row_and_field_that_differs(
        tmp_path: Path, pg_url: str) -> None:
    await fill(tmp_path)
    source = await SqliteEventStore.open(tmp_path / "events.db", read_only=True)
    sink = await open_event_store(pg_url)
    try:
        rows = await all_rows(source)
        tampered = msgspec.structs.replace(rows[1], data=b'{"text":"changed"}', ts=1)
        await sink.recorder.copy_rows([rows[0], tampered, *rows[2:-1]])
        keys, differ = await verify_copy(source, sink, len(rows) - 1, 2, Progress(quiet=True))
    finally:
        await sink.close()
        await source.close()
    assert keys == 2
    assert differ[0] == "seq 2: ts, data differ"
    assert differ[1].startswith(f"the source has events after seq {len(rows) - 1} that were "
                                "not copied")


def test_migrate_refuses_a_target_no_backend_serves_or_that_cannot_be_reached(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    wrong = upulse("migrate", "--home", home, "--to", "mysql://db.example/pulse", ok=False)
    assert wrong.returncode == 2 and "unknown scheme 'mysql'" in wrong.stderr
    assert "(installed: postgres://, postgresql://, sqlite://)" in wrong.stderr
    gone = upulse("migrate", "--home", home, "--to", unreachable(), ok=False)
    assert gone.returncode == 1 and gone.stderr.count("\n") == 1
    assert "127.0.0.1:" in gone.stderr and "s3cret-pw" not in gone.stderr
    assert "Traceback" not in gone.stderr


async def test_migrate_moves_a_home_from_postgresql_back_to_sqlite_exactly(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    home = upulse.init(tmp_path / "home")
    await fill(home, notes=30)
    ours = await _rows_of(home)
    migrated(upulse, home, pg_url, "--switch")
    back = f"sqlite://{tmp_path}/back/events.db"
    (tmp_path / "back").mkdir()
    report = migrated(upulse, home, back, "--switch", "--page", "7")
    assert report["verified"] is True and report["switched"] is True
    assert (report["source"], report["target"]) == (pg_url, back)
    assert await rows_at(back) == ours  # every field, the unreadable row byte for byte
    assert json.loads((home / "config.json").read_text())["store"] == back
    moved = upulse("task", "assign", "t-1", "ada", "--home", home).stdout
    assert f"(event #{len(ours) + 1}, version 2)" in moved
    assert len(await rows_at(pg_url)) == len(ours)  # the old log is kept as it was


async def test_a_log_holding_a_nul_character_moves_to_a_backend_whose_text_stores_it(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    await fill(home, notes=3)
    nul_rows(home / "events.db")
    target = f"sqlite://{tmp_path}/copy.db"
    report = migrated(upulse, home, target)
    assert report["verified"] is True and report["events"] == 8
    assert [r.key for r in await rows_at(target)][-2:] == ["t-\x00", "t-3"]


@pytest.mark.usefixtures("memory_backend")
async def test_migrate_copies_into_a_third_backend_registered_by_an_entry_point(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    await fill(home, notes=30)
    write_default(home / "config.json", "default")
    ours = await _rows_of(home)
    assert await migrate(Home(home), to="memory://moved", switch=True, page=4,
                         as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["target"], report["verified"], report["switched"]) == (
        "memory://moved", True, True)
    assert memory_store.LOGS["moved"].rows == ours
    assert json.loads((home / "config.json").read_text())["store"] == "memory://moved"


async def test_a_target_filled_by_someone_else_after_its_emptiness_check_is_left_alone(
        tmp_path: Path) -> None:
    """Where the target's exclusive sections do not reach other processes (a SQLite file),
    the copy's first page decides: the second migration writes nothing and says so."""
    await fill(tmp_path / "a")
    await fill(tmp_path / "b")
    source = await SqliteEventStore.open(tmp_path / "a" / "events.db", read_only=True)
    sink = await open_event_store(f"sqlite://{tmp_path}/target.db")
    try:
        await sink.recorder.copy_rows(await _rows_of(tmp_path / "b"))  # the other one won
        with pytest.raises(MigrationInProgress) as info:
            await _copy(source, sink, 2, Progress(quiet=True))
    finally:
        await sink.close()
        await source.close()
    said = str(info.value)
    assert "since it was found empty" in said and "leave it alone" in said
    assert "drop" not in said and "empty it" not in said
    assert await rows_at(f"sqlite://{tmp_path}/target.db") == await _rows_of(tmp_path / "b")


def pulse_schema_count(server: PostgresServer, url: str) -> str:
    """'1' once something created pulse's schema in the database of `url`, '0' before."""
    return server.sql("SELECT count(*) FROM information_schema.schemata WHERE "
                      "schema_name = 'pulse'", database(url))


async def effects_in_every_state(home: Path) -> list[str]:
    """Four RestartProcess effects decided on the home's own log: one acked, one pending,
    one executing (claimed) and one retrying (failed, not finally); the ids of the three
    unfinished ones."""
    stores = await open_home(home)
    store = stores.events
    try:
        done = await store.append([effect_draft(RestartProcess(name=f"p-{n}", argv=("true",)),
                                                origin="rule") for n in range(4)])
        acked, _, claimed, failed = (e.key for e in done.events)
        await store.append([
            EventDraft("effect-executing", claimed, {"attempt": 1, "lease_until": 1,
                                                     "owner": "host:1", "pid": 1,
                                                     "started": 0.0}, origin="engine"),
            EventDraft("effect-failed", failed, {"attempt": 1, "error": "busy",
                                                 "retry_at": 1}, origin="engine"),
            EventDraft("effect-acked", acked, {"attempt": 1, "result": None}, origin="engine"),
        ])
        return [e.key for e in done.events[1:]]
    finally:
        await stores.close()


async def finish(home: Path, effect_ids: list[str]) -> None:
    """An `effect-acked` for each of `effect_ids`, as an executor that drained them writes."""
    stores = await open_home(home)
    try:
        await stores.events.append([
            EventDraft("effect-acked", key, {"attempt": 2, "result": None}, origin="engine")
            for key in effect_ids])
    finally:
        await stores.close()


async def test_migrate_switch_refuses_while_effects_are_unfinished_and_copies_nothing(
        upulse: Upulse, tmp_path: Path, pg_url: str, postgres_server: PostgresServer) -> None:
    home = upulse.init(tmp_path / "home")
    unfinished = await effects_in_every_state(home)
    done = upulse("migrate", "--home", home, "--to", pg_url, "--switch", ok=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert ("migrate refused: 3 effect(s) of this home are unfinished (1 pending, "
            "1 executing, 1 retrying)") in done.stderr
    assert "`upulse effects --pending`" in done.stderr
    assert pulse_schema_count(postgres_server, pg_url) == "0"  # not even the schema
    assert json.loads((home / "config.json").read_text())["store"] is None
    await finish(home, unfinished)
    report = migrated(upulse, home, pg_url, "--switch")
    assert report["switched"] is True and report["unfinished_effects"] == 0


async def test_a_migrate_rehearsal_copies_despite_unfinished_effects_and_says_switch_refuses(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    home = upulse.init(tmp_path / "home")
    await effects_in_every_state(home)
    done = upulse("migrate", "--home", home, "--to", pg_url)
    assert done.stdout.startswith("verified: 7 events")
    assert "3 unfinished effect(s): --switch refuses until they are finished" in done.stdout
    assert len(await rows_at(pg_url)) == 7


def nul_rows(db: Path) -> list[int]:
    """Two stored rows holding a NUL character, one in its key and one in its idem and
    origin (SQLite takes it; PostgreSQL's text cannot); their seqs."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        seq = conn.execute("SELECT coalesce(max(seq), 0) + 1 FROM events").fetchone()[0]
        for n, (key, idem, origin) in enumerate((("t-\x00", None, "agent"),
                                                 ("t-3", "idem-\x00", "agent:\x00"))):
            conn.execute("INSERT INTO events VALUES (?, ?, 'notification', ?, 1, "
                         "1700000000000, ?, NULL, 'tx-nul', ?, ?, NULL)",
                         (seq + n, f"id-nul-{n}", key, origin, idem, b'{"text":"nul"}'))
        conn.execute("COMMIT")
    finally:
        conn.close()
    return [seq, seq + 1]


async def test_migrate_refuses_a_log_holding_a_nul_character_naming_the_rows_before_copying(
        upulse: Upulse, tmp_path: Path, pg_url: str, postgres_server: PostgresServer) -> None:
    home = upulse.init(tmp_path / "home")
    await fill(home, notes=3)
    first, second = nul_rows(home / "events.db")
    before = fingerprint(home)
    done = upulse("migrate", "--home", home, "--to", pg_url, "--switch", "--page", "2",
                  ok=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert (f"migrate refused: 2 event(s) of sqlite://{home}/events.db hold a NUL character "
            f"(\\x00), which PostgreSQL cannot store: seq {first} (key), seq {second} "
            "(origin, idem)") in done.stderr
    assert "nothing was copied" in done.stderr
    assert "copying" not in done.stderr  # refused before the first row was read for it
    assert pulse_schema_count(postgres_server, pg_url) == "0"
    assert fingerprint(home) == before


async def _held_while(url: str, run: Callable[[], subprocess.CompletedProcess[str]]
                      ) -> subprocess.CompletedProcess[str]:
    """`run` (in a thread) while the target's migration lock is held, as a migration copying
    there holds it."""
    store = await open_event_store(url)
    try:
        async with store.recorder.exclusive(MIGRATION_LOCK):
            return await asyncio.to_thread(run)
    finally:
        await store.close()


async def test_migrate_refuses_a_target_another_migration_is_copying_into_and_leaves_it(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    home = upulse.init(tmp_path / "home")
    await fill(home)
    done = await _held_while(pg_url, lambda: upulse(
        "migrate", "--home", home, "--to", pg_url, "--switch", ok=False))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "migrate refused: another `upulse migrate` is copying into postgresql://" in (
        done.stderr)
    assert "leave it alone" in done.stderr and "drop" not in done.stderr
    assert await rows_at(pg_url) == []
    assert json.loads((home / "config.json").read_text())["store"] is None


def test_two_migrations_into_one_empty_log_at_once_one_wins_the_other_never_says_drop(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    homes = [upulse.init(tmp_path / name) for name in ("a", "b")]
    for home in homes:
        asyncio.run(fill(home, notes=3_000))
    runs = [subprocess.Popen([sys.executable, "-m", "pulse_cli", "migrate", "--home",
                              str(home), "--to", pg_url, "--switch", "--page", "200"],
                             env=upulse.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True) for home in homes]
    outcomes = [(run.wait(timeout=90), *run.communicate()) for run in runs]
    assert sorted(code for code, _, _ in outcomes) == [0, 1], outcomes
    [(winner, (_, won, _))] = [(h, o) for h, o in zip(homes, outcomes, strict=True) if not o[0]]
    [(loser, (_, _, said))] = [(h, o) for h, o in zip(homes, outcomes, strict=True) if o[0]]
    assert "drop" not in said, said
    assert ("another `upulse migrate` is copying into" in said
            or "already holds 3003 event(s)" in said), said
    assert won.startswith("verified: 3003 events")
    assert json.loads((winner / "config.json").read_text())["store"] == pg_url
    assert json.loads((loser / "config.json").read_text())["store"] is None
    assert asyncio.run(rows_at(pg_url)) == asyncio.run(_rows_of(winner))


async def _rows_of(home: Path) -> list[StoredRow]:
    source = await SqliteEventStore.open(home / "events.db", read_only=True)
    try:
        return await all_rows(source)
    finally:
        await source.close()
