"""What the log fault tests share: a note kind and its projection, an effect and its
executor, and ways to damage events.db as a bad disk or a crash would."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from pulse_core import (
    Effect,
    Engine,
    Event,
    EventDraft,
    ExecutionContext,
    Executor,
    Projection,
    register_kind,
)

register_kind("fault-note", "a note written by the log fault tests; data: n")


class Job(Effect, tag="log-fault-job"):
    n: int


class Jobs(Executor):
    handles = (Job,)
    timeout = 5.0

    def __init__(self) -> None:
        self.ran: list[int] = []

    async def execute(self, effect: Job, ctx: ExecutionContext) -> int:
        self.ran.append(effect.n)
        return effect.n


class Notes(Projection[tuple[int, ...]]):
    """The `n` of every fault-note, in log order."""

    name = "fault-notes"
    kinds = frozenset({"fault-note"})

    def initial(self) -> tuple[int, ...]:
        return ()

    def apply(self, state: tuple[int, ...], event: Event) -> tuple[int, ...]:
        return (*state, event.data["n"])


def note(n: int, **data: Any) -> EventDraft:
    return EventDraft("fault-note", f"note-{n}", {"n": n, **data})


def engine_at(home: Path, jobs: Jobs | None = None) -> Engine:
    return Engine(home, executors=[jobs or Jobs()], projections=[Notes()])


async def notes_of(engine: Engine) -> tuple[int, ...]:
    snapshot = await engine.snapshot()
    return snapshot.state(Notes)


ROOT = Path(__file__).resolve().parents[2]


def without_sidecars(db: Path) -> bool:
    """Delete db's -wal and -shm; whether there was a -wal."""
    had_wal = Path(f"{db}-wal").exists()
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    return had_wal


def truncate(path: Path) -> None:
    with open(path, "r+b") as file:
        file.truncate(0)


def corrupt_data_of(db: Path, marker: str) -> None:
    """Overwrite the first closing brace after `marker` (a string value, once in the log) in
    the data of its event, in the file itself (as a bad disk or a stray write would), and check
    SQLite still finds the file intact."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    without_sidecars(db)
    raw = bytearray(db.read_bytes())
    needle = f'"{marker}"'.encode()
    assert raw.count(needle) == 1
    raw[raw.index(b"}", raw.index(needle) + len(needle))] = ord("#")
    db.write_bytes(bytes(raw))
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()
