"""`upulse backup`, `restore` and `export` on real homes: a backup taken while the daemon
writes, restored into a new home and compared event by event; corrupt backups and running
daemons refused; every exported line parsed back into the stored event."""

from __future__ import annotations

import asyncio
import hashlib
import json
import stat
import threading
from pathlib import Path

import msgspec

from pulse_core import Event, HomeLayout
from pulse_core.store import ObjectStore, open_event_store, parse_store_url
from tests.cli.runner import Upulse, daemon_pid, wait_until
from tests.cli.support import git


def events_of(url: str, up_to: int | None = None) -> list[Event]:
    """Every event of the log at `url` (read-only), up to seq `up_to`."""
    async def read() -> list[Event]:
        store = await open_event_store(parse_store_url(url), read_only=True)
        try:
            return [e for e in await store.read() if up_to is None or e.seq <= up_to]
        finally:
            await store.close()
    return asyncio.run(read())


def home_events(home: Path, up_to: int | None = None) -> list[Event]:
    return events_of(HomeLayout(home).store_url(), up_to)


def manifest(backup: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((backup / "manifest.json").read_text())
    return loaded


def put_object(home: Path, data: bytes) -> str:
    async def put() -> str:
        return await ObjectStore(home / "objects").put(data)
    return asyncio.run(put())


def test_a_backup_taken_while_the_daemon_writes_restores_event_by_event(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    digest = put_object(home, b"a payload an event names")
    upulse("daemon", "start", "--home", home)
    wait_until(lambda: home_events(home), 10, "the daemon's first event")
    stop = threading.Event()
    written: list[int] = []

    def write() -> None:  # a second writer beside the daemon, through the backup
        while not stop.is_set():
            n = len(written)
            upulse("task", "create", f"t-{n}", "--title", f"task {n}", "--home", home)
            written.append(n)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        wait_until(lambda: len(written) >= 2, 30, "two tasks written")
        upulse("backup", tmp_path / "backup", "--home", home)
    finally:
        stop.set()
        writer.join()
    upulse("task", "create", "after", "--title", "after the backup", "--home", home)

    backup = tmp_path / "backup"
    listed = manifest(backup)
    last_seq = listed["last_seq"]
    assert isinstance(last_seq, int) and last_seq >= 3
    files = listed["files"]
    assert isinstance(files, dict)
    assert {"events.db", "vitals.db", "state.db", "config.json",
            "engine/.git/HEAD"} <= set(files)
    assert any(name.startswith("objects/") and digest[-16:] in name for name in files)
    assert not any(name in files for name in ("ui.token", "daemon.pid", "engine.lock"))
    assert stat.S_IMODE(backup.stat().st_mode) == 0o700
    assert stat.S_IMODE((backup / "events.db").stat().st_mode) == 0o600
    assert not (backup / "events.db-wal").exists()

    restored = tmp_path / "restored"
    done = upulse("restore", backup, "--home", restored)
    assert f"{last_seq} events up to seq {last_seq}, verified row by row" in done.stdout
    source = home_events(home)
    assert source[-1].seq > last_seq  # the home went on writing after the backup
    assert home_events(restored) == home_events(home, up_to=last_seq)
    assert listed["events"] == last_seq
    assert any(digest[-16:] in str(p) for p in (restored / "objects").rglob("*"))
    # The restored engine directory is its own; the backed-up home's is untouched.
    assert str(restored / "staging") in git(restored / "engine", "worktree", "list")
    assert str(home / "staging") in git(home / "engine", "worktree", "list")
    assert git(restored / "staging", "rev-parse", "--abbrev-ref", "HEAD") == "staging"
    upulse("daemon", "start", "--home", restored)
    upulse.homes.append(restored)
    assert "task-created" in upulse("events", "--home", restored).stdout


def test_restore_refuses_a_backup_whose_file_differs_from_its_hash(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("task", "create", "t-1", "--title", "one", "--home", home)
    backup = tmp_path / "backup"
    upulse("backup", backup, "--home", home)
    events_db = backup / "events.db"
    data = bytearray(events_db.read_bytes())
    data[-1] ^= 0xFF
    events_db.write_bytes(bytes(data))
    target = tmp_path / "restored"
    refused = upulse("restore", backup, "--home", target, ok=False)
    assert refused.returncode == 1
    assert f"the backup ({backup}) does not match its manifest" in refused.stderr
    assert "events.db has sha256" in refused.stderr and "nothing was restored" in refused.stderr
    assert not target.exists()

    (backup / "manifest.json").unlink()
    missing = upulse("restore", backup, "--home", target, ok=False)
    assert missing.returncode == 1 and "manifest.json cannot be read" in missing.stderr


def test_a_backup_whose_log_cannot_be_read_is_refused_and_leaves_no_home(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    backup = tmp_path / "backup"
    upulse("backup", backup, "--home", home)
    (backup / "events.db").write_bytes(b"not a SQLite database at all" * 100)
    listed = json.loads((backup / "manifest.json").read_text())
    listed["files"]["events.db"] = {"size": 2800, "sha256": hashlib.sha256(
        (backup / "events.db").read_bytes()).hexdigest()}
    (backup / "manifest.json").write_text(json.dumps(listed))
    target = tmp_path / "restored"
    refused = upulse("restore", backup, "--home", target, ok=False)
    assert refused.returncode == 1
    assert "events.db cannot be read" in refused.stderr, refused.stderr
    assert not target.exists()
    assert not list(tmp_path.glob(".restored.restoring-*"))


def test_restore_is_refused_while_the_daemon_runs_and_over_a_home_without_force(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("task", "create", "t-1", "--title", "one", "--home", home)
    backup = tmp_path / "backup"
    upulse("backup", backup, "--home", home)
    upulse("task", "create", "t-2", "--title", "two", "--home", home)
    before = home_events(home)

    upulse("daemon", "start", "--home", home)
    pid = daemon_pid(home)
    running = upulse("restore", backup, "--home", home, "--force", ok=False)
    assert running.returncode == 3 and f"the daemon (pid {pid})" in running.stderr
    assert daemon_pid(home) == pid
    upulse("daemon", "stop", "--home", home)

    after_stop = home_events(home)
    assert after_stop[: len(before)] == before
    unforced = upulse("restore", backup, "--home", home, ok=False)
    assert unforced.returncode == 1 and "is not empty" in unforced.stderr
    assert home_events(home) == after_stop

    forced = upulse("restore", backup, "--home", home, "--force")
    [kept] = tmp_path.glob("home.before-restore-*")
    assert str(kept) in forced.stdout
    assert home_events(kept) == after_stop
    assert [e.key for e in home_events(home) if e.kind == "task-created"] == ["t-1"]


def test_export_writes_every_event_as_a_json_line_that_parses_back(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    for n in range(7):
        upulse("task", "create", f"t-{n}", "--title", f"task {n}", "--home", home)
    upulse("task", "assign", "t-3", "agent-a", "--home", home)
    stored = home_events(home)

    lines = upulse("export", "--page", "2", "--home", home).stdout.splitlines()
    assert [msgspec.json.decode(line, type=Event) for line in lines] == stored

    after_3 = upulse("export", "--since", "3", "--home", home).stdout.splitlines()
    assert [msgspec.json.decode(line, type=Event) for line in after_3] == stored[3:]
    since = upulse("export", "--since", "3", "--kind", "task-assigned", "--home", home)
    parsed = [msgspec.json.decode(line, type=Event) for line in since.stdout.splitlines()]
    assert parsed == [e for e in stored if e.seq > 3 and e.kind == "task-assigned"]
    assert len(parsed) == 1


def test_a_home_on_postgresql_is_backed_up_without_its_log_and_says_how_to_dump_it(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    home = tmp_path / "home"
    upulse.homes.append(home)
    upulse("init", "--home", home, "--store", pg_url)
    upulse("task", "create", "t-1", "--title", "one", "--home", home)
    backup = tmp_path / "backup"
    done = upulse("backup", backup, "--home", home)
    assert "NOT in this backup: the event log" in done.stdout
    assert "pg_dump --format=custom" in done.stdout
    listed = manifest(backup)
    assert listed["log_included"] is False and "config.json" in str(listed["files"])
    assert not (backup / "events.db").exists()

    exported = upulse("export", "--home", home).stdout.splitlines()
    assert [msgspec.json.decode(line, type=Event) for line in exported] == events_of(pg_url)

    restored = upulse("restore", backup, "--home", tmp_path / "restored")
    assert "pg_restore" in restored.stdout
    assert json.loads((tmp_path / "restored" / "config.json").read_text())["store"] == pg_url


def test_backup_writes_only_a_new_folder_outside_the_home(upulse: Upulse, tmp_path: Path
                                                          ) -> None:
    home = upulse.init(tmp_path / "home")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    refused = upulse("backup", taken, "--home", home, ok=False)
    assert refused.returncode == 1 and "is not an empty folder" in refused.stderr
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]
    inside = upulse("backup", home / "backup", "--home", home, ok=False)
    assert inside.returncode == 2 and "inside the home" in inside.stderr
    assert not (home / "backup").exists() and not list(tmp_path.glob("*.partial"))
