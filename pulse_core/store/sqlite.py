"""Opening pulse's SQLite files: identity and schema checks, pragmas, typed errors."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pulse_core.errors import NotAPulseDatabase, SchemaTooNew, StoreUnavailable

# 'puls' in ASCII: marks a file as pulse's, so a stray database is never mistaken for ours.
APPLICATION_ID = 0x70756C73

_UNAVAILABLE = {
    "locked": "another process holds the write lock: stop it, or raise busy_timeout",
    "busy": "another process holds the write lock: stop it, or raise busy_timeout",
    "full": "the disk is full: free space, then retry",
    "disk i/o": "the disk refused the write (full, over quota, or failing): check it, then retry",
    "readonly": "the file or folder is read-only: fix its permissions",
    "read-only": "the file or folder is read-only: fix its permissions",
    "unable to open": "the file cannot be opened: check the path and its permissions",
}


def classify(exc: sqlite3.Error, path: Path) -> Exception:
    """The typed pulse error for a SQLite error on `path`."""
    text = str(exc).lower()
    for word, advice in _UNAVAILABLE.items():
        if word in text:
            return StoreUnavailable(f"{path}: {exc} — {advice}")
    if isinstance(exc, sqlite3.DatabaseError) and (
        "not a database" in text or "malformed" in text or "corrupt" in text
    ):
        return NotAPulseDatabase(f"{path}: {exc} — the file is not an intact SQLite database")
    return StoreUnavailable(f"{path}: {exc}")


@contextmanager
def sqlite_errors(path: Path) -> Iterator[None]:
    """Re-raise SQLite errors inside the block as typed pulse errors naming `path`."""
    try:
        yield
    except sqlite3.Error as exc:
        raise classify(exc, path) from exc


def open_database(
    path: Path,
    *,
    schema: str,
    schema_version: int,
    synchronous: str,
    purpose: str,
    timeout: float = 10.0,
) -> sqlite3.Connection:
    """A connection to `path`, created with `schema` if new, checked to be pulse's if not.

    Raises NotAPulseDatabase for a foreign or corrupted file and SchemaTooNew for a file
    written by a newer pulse. The connection is in autocommit mode; callers BEGIN themselves.
    """
    if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")
    with sqlite_errors(path):
        conn = sqlite3.connect(
            path, timeout=timeout, isolation_level=None, check_same_thread=False
        )
    try:
        with sqlite_errors(path):
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if app_id != APPLICATION_ID and not (app_id == 0 and tables == 0):
            raise NotAPulseDatabase(
                f"{path} is a SQLite database of another program (application_id {app_id:#x}), "
                f"not a pulse {purpose} — point pulse at its own home folder"
            )
        if version > schema_version:
            raise SchemaTooNew(
                f"{path} has {purpose} schema {version}; this pulse reads up to "
                f"{schema_version} — upgrade pulse"
            )
        with sqlite_errors(path):
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
            if tables == 0:
                # Schemas use IF NOT EXISTS: two processes may create the same new file.
                conn.executescript(
                    f"BEGIN IMMEDIATE; {schema}; PRAGMA application_id={APPLICATION_ID}; "
                    f"PRAGMA user_version={schema_version}; COMMIT;"
                )
    except BaseException:
        conn.close()
        raise
    return conn
