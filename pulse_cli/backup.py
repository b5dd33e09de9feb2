"""`upulse backup DEST`: a consistent snapshot of a home, taken while its daemon runs
(docs/backup.md).

The SQLite stores (events.db, vitals.db, state.db) are copied with SQLite's online backup
API (pulse_core.store.copy_sqlite_file, in a worker thread): each copy is one read
transaction, so it holds every event committed before it began and nothing half written.
Checkpoints are copied before the log (a checkpoint is never ahead of the log it comes
with; the engine replays what follows it), objects after it (every payload an event of the
snapshot names is there). config.json, host.id, the engine directory (engine/, its git
history and branches) and its staging worktree are copied as files.

Left out: what the daemon rewrites as it runs (daemon.pid, daemon.status.json, daemon.log,
engine.lock, logs/), ui.token, the web UI's credential (a restored home is given a new one
when the web layer starts), and keys.db, the memory elements' keys: a backup holds their
text sealed, so a purge (which destroys the key in the home) erases it from every backup
made before. `--keys FILE` writes the keys to a separate file for whoever must be able to
restore onto another machine; a purge cannot reach that copy. What stays is still
secret-bearing (config.json may name passwords; the log holds what the agent saw), so DEST is
made 0700 and its files 0600.

The backup is written into DEST.partial and renamed to DEST once manifest.json (every
file's size and sha256, the log's last seq and counts, the pulse version) is written: a
DEST that exists is whole. A log that is not a file of this machine (PostgreSQL) is not in
the backup: the home's files are, and the command says how to dump the log (pg_dump).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from pulse_cli import config as config_file
from pulse_cli.home import CliError, Home, UsageError
from pulse_cli.output import print_json, printable
from pulse_cli.stores import shown, store_url
from pulse_core import installed_version, private_folder, write_private
from pulse_core.store import ElementKeys, LogLocation, copy_sqlite_file, parse_store_url

FORMAT = 1
MANIFEST = "manifest.json"
EVENTS = "events.db"
STORES = ("vitals.db", "state.db")
TREES = ("engine", "staging")
SKIPPED = shutil.ignore_patterns("__pycache__", ".mypy_cache", ".pytest_cache", ".venv",
                                 ".ruff_cache")
CHUNK = 1 << 20


class BackupRefused(CliError):
    """DEST cannot take a backup (it exists and is not empty), or the home cannot be read."""


class BackupFile(msgspec.Struct, frozen=True):
    """One file of a backup: its size in bytes and the sha256 of its content."""

    size: int
    sha256: str


class BackupManifest(msgspec.Struct):
    """DEST/manifest.json: what a backup holds and how to check it.

    `files` maps every file's path (relative to DEST, '/'-separated) to its size and
    sha256; `last_seq` and `events` are the log's as the snapshot saw it (0 when
    `log_included` is false: the log lives on a server and is dumped with its own tool).
    """

    format: int
    pulse_version: str
    created_at: int
    created: str
    home: str
    log: str
    log_included: bool
    last_seq: int
    events: int
    objects: int
    checkpoints: int
    files: dict[str, BackupFile]


class KeysFile(msgspec.Struct, frozen=True):
    """What `upulse backup --keys FILE` writes: the home it came from, when, and every live
    element key (base64) by element id."""

    format: int
    home: str
    created_at: int
    keys: dict[str, str]


async def backup(home: Home, *, dest: Path, as_json: bool, keys_file: Path | None = None
                 ) -> int:
    """Back up `home` into the new folder `dest` (see the module's docstring); exit 0, also
    for a home whose log is on a server (then the output says how to dump it). With
    `keys_file`, the elements' keys are written there too (a new file outside DEST)."""
    home.readable()
    cfg = config_file.load_or_default(home.config)
    url = store_url(home, cfg)
    location = parse_store_url(url)
    if keys_file is not None:
        _check_keys_file(keys_file, dest)
    partial = _fresh(dest, home)
    layout = home.layout
    await asyncio.to_thread(_copy_tree, layout.checkpoints, partial / "checkpoints")
    if location.file is not None:
        await asyncio.to_thread(_snapshot, location.file, partial / EVENTS)
    for name in STORES:
        await asyncio.to_thread(_snapshot, home.root / name, partial / name)
    await asyncio.to_thread(_copy_tree, layout.objects, partial / "objects")
    for name in ("config.json", config_file.HOST_FILE):
        if (home.root / name).is_file():
            shutil.copyfile(home.root / name, partial / name)
    for name in TREES:
        await asyncio.to_thread(_copy_tree, home.root / name, partial / name)
    manifest = await asyncio.to_thread(_manifest, home, partial, location)
    write_private(partial / MANIFEST, msgspec.json.format(msgspec.json.encode(manifest),
                                                          indent=2) + b"\n")
    await asyncio.to_thread(_private, partial)
    partial.rename(dest)
    if keys_file is not None:
        count = await asyncio.to_thread(write_keys, home, keys_file)
        if not as_json:
            print(printable(f"wrote {count} element keys to {keys_file} — keep it apart from "
                            "the backup: a purge cannot reach this copy"))
    _report(manifest, dest, location, url, as_json)
    return 0


def _check_keys_file(keys_file: Path, dest: Path) -> None:
    if keys_file.exists() or keys_file == dest or dest in keys_file.parents:
        raise UsageError(f"--keys {keys_file}: give a new file outside DEST — keys kept "
                         "beside the data they open would make a purge erase nothing")


def write_keys(home: Home, target: Path) -> int:
    """Write the home's live element keys to `target` (0600, JSON); how many."""
    keys = ElementKeys(home.layout.keys_db, read_only=True)
    try:
        found = keys.export()
    finally:
        keys.close()
    body = KeysFile(format=FORMAT, home=str(home.root), created_at=int(time.time() * 1000),
                    keys=found)
    write_private(target, msgspec.json.encode(body) + b"\n")
    return len(found)


def _fresh(dest: Path, home: Home) -> Path:
    """DEST.partial, new and empty (0700); BackupRefused when DEST exists and is not empty
    or lies inside the home."""
    if dest == home.root or home.root in dest.parents:
        raise UsageError(f"DEST {dest} is inside the home {home.root} — give a folder "
                         "outside it (another disk, ideally)")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupRefused(f"{dest} already exists and is not an empty folder — backup "
                            "writes a new folder: give a new path (a dated one, say)")
    with contextlib.suppress(FileNotFoundError):
        dest.rmdir()
    partial = dest.with_name(dest.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)  # what an interrupted backup left
    private_folder(partial)
    return partial


def _snapshot(source: Path, target: Path) -> None:
    """A consistent copy of the SQLite database `source` (if there is one), made one
    self-contained file (rollback journal, not WAL): reading it writes nothing beside it."""
    copy_sqlite_file(source, target)
    if target.exists():
        copy = sqlite3.connect(target)
        try:
            copy.execute("PRAGMA journal_mode=DELETE")
        finally:
            copy.close()


def _copy_tree(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True, ignore=SKIPPED)


def _files(root: Path) -> Iterator[Path]:
    """Every regular file under `root`, sorted (symlinks are listed, not followed)."""
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                yield path


def file_entry(path: Path) -> BackupFile:
    """The size and sha256 of the file at `path`."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return BackupFile(size=path.stat().st_size, sha256=digest.hexdigest())


def _manifest(home: Home, partial: Path, location: LogLocation) -> BackupManifest:
    included = (partial / EVENTS).is_file()
    last_seq = events = 0
    if included:
        copy = sqlite3.connect(f"{(partial / EVENTS).as_uri()}?mode=ro", uri=True)
        try:
            last_seq, events = copy.execute(
                "SELECT coalesce(max(seq), 0), count(*) FROM events").fetchone()
        finally:
            copy.close()
    files = {path.relative_to(partial).as_posix(): file_entry(path)
             for path in _files(partial)}
    now = time.time()
    return BackupManifest(
        format=FORMAT, pulse_version=pulse_version(), created_at=int(now * 1000),
        created=datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
        home=str(home.root), log=location.display(), log_included=included,
        last_seq=last_seq, events=events,
        objects=sum(1 for name in files if name.startswith("objects/")),
        checkpoints=sum(1 for name in files if name.startswith("checkpoints/")),
        files=files)


def pulse_version() -> str:
    """The installed upulse distribution's version ("unknown" from a bare source tree)."""
    return installed_version() or "unknown"


def _private(root: Path) -> None:
    """Folders 0700 and files 0600 (0700 if executable, a git hook) under `root`."""
    for folder, _, names in os.walk(root):
        os.chmod(folder, 0o700)
        for name in names:
            path = Path(folder) / name
            if not path.is_symlink():
                os.chmod(path, 0o700 if path.stat().st_mode & 0o100 else 0o600)


def dump_command(location: LogLocation, url: str, dest: Path) -> str:
    """How to dump a log this backup could not hold, as a shell line (no password)."""
    if location.backend == "PostgreSQL":
        return (f"pg_dump --format=custom --file={dest}/events.pgdump '{shown(url)}'  "
                "(the password from PGPASSWORD or ~/.pgpass)")
    return f"the dump tool of {location.backend} on {location.display()}"


def _report(manifest: BackupManifest, dest: Path, location: LogLocation, url: str,
            as_json: bool) -> None:
    if as_json:
        print_json(manifest)
        return
    size = sum(entry.size for entry in manifest.files.values())
    log = (f"{manifest.events} events (last seq {manifest.last_seq})"
           if manifest.log_included else "no events (the log is not a file of this home)")
    print(printable(f"backed up {manifest.home} to {dest}: {log}, {manifest.objects} "
                    f"objects, {manifest.checkpoints} checkpoints, {len(manifest.files)} "
                    f"files, {size} bytes; hashes in {dest / MANIFEST}"))
    if not manifest.log_included:
        print(printable(f"NOT in this backup: the event log at {location.display()} — dump "
                        f"it yourself: {dump_command(location, url, dest)}"))
