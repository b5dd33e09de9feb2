"""Consistent copies, read without writing: a SQLite file of a home, and an event log of any
backend into a new SQLite log (what the dry run and the promote gate tick on)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from pulse_core.store._backends import LogLocation, parse_store_url
from pulse_core.store._sqlite_recorder import SqliteRecorder
from pulse_core.store._url import SqliteURL


def copy_sqlite_file(source: Path, target: Path) -> None:
    """A consistent copy of SQLite database `source` in `target`; nothing else is written.

    Without a -wal file the database file alone holds everything: it is read as immutable
    (no lock, no -wal or -shm created). With a -wal and its -shm (an engine has it open, or
    one crashed), the WAL's commits are read with the -shm mapped read-only, so it is never
    rewritten. A -wal without its -shm cannot be open anywhere: the two files are copied to
    `target` and the WAL is checkpointed there. An absent `source` copies nothing.
    """
    if not source.exists():
        return
    wal, shm = (source.with_name(source.name + suffix) for suffix in ("-wal", "-shm"))
    if wal.exists() and not shm.exists():
        shutil.copyfile(source, target)
        shutil.copyfile(wal, target.with_name(target.name + "-wal"))
        copy = sqlite3.connect(target)
        try:
            copy.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            copy.close()
        return
    mode = "readonly_shm=1" if wal.exists() else "immutable=1"
    src = sqlite3.connect(f"{source.absolute().as_uri()}?mode=ro&{mode}", uri=True)
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()


async def copy_log(url: str | LogLocation, target: Path, *, page: int = 5_000) -> None:
    """The event log at `url` copied exactly (same seq, ids, versions, data bytes) into a new
    SQLite log at `target`, read-only: a SQLite file with SQLite's backup API (consistent
    while an engine writes, a crashed writer's WAL included), any other backend row by row
    through its recorder. StoreError when the log cannot be opened."""
    location = parse_store_url(url) if isinstance(url, str) else url
    if isinstance(location, SqliteURL):  # SQLite into SQLite: the file, as it is
        copy_sqlite_file(location.path, target)
        return
    source = await location.open(read_only=True, clock=None)
    try:
        sink = await SqliteRecorder.open(target)
        try:
            after = 0
            while rows := await source.rows(after, page):
                await sink.copy_rows(rows)
                after = rows[-1].seq
        finally:
            await sink.close()
    finally:
        await source.close()
