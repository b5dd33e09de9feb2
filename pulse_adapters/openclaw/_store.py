"""OpenClaw's per-agent session store, read-only: transcript rows, notices found, sizes.

OpenClaw 2026.9.6 (agent schema 23) keeps sessions and transcripts in
`<state>/agents/<agent>/agent/openclaw-agent.sqlite`: table `transcript_events`
(`session_id`, `seq`, `event_json`, or `event_zstd` for compressed rows) holds one JSON
transcript entry per row, numbered by `seq` within a session; `session_windows` maps each
`session_id` to its `session_key`. Nothing here writes to it.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUSY_TIMEOUT_MS = 2_000


@dataclass(frozen=True)
class TranscriptRow:
    """One stored transcript entry: `text` is its JSON, None when stored compressed (bytes
    that are not UTF-8 are read as U+FFFD)."""

    session_id: str
    seq: int
    text: str | None


class AgentStore:
    """The session store of one OpenClaw agent under `state_dir`."""

    def __init__(self, state_dir: Path, agent: str) -> None:
        self.state_dir = state_dir
        self.agent = agent
        self.path = state_dir / "agents" / agent / "agent" / "openclaw-agent.sqlite"
        self.sessions_dir = state_dir / "agents" / agent / "sessions"

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                             timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
        try:
            yield db
        finally:
            db.close()

    def exists(self) -> bool:
        """Whether the agent has a store yet (OpenClaw creates it with the first session)."""
        return self.path.is_file()

    def session_heads(self) -> dict[str, int]:
        """Each transcript session's highest stored seq (blocking)."""
        if not self.exists():
            return {}
        with self._reading() as db:
            rows = db.execute("SELECT session_id, MAX(seq) FROM transcript_events "
                              "GROUP BY session_id").fetchall()
        return {str(sid): int(seq) for sid, seq in rows}

    def rows_after(self, session_id: str, seq: int, limit: int) -> list[TranscriptRow]:
        """Up to `limit` rows of `session_id` after `seq`, oldest first (blocking)."""
        with self._reading() as db:
            # as bytes: sqlite3 refuses a whole fetch over one TEXT value that is not UTF-8
            rows = db.execute(
                "SELECT session_id, seq, CAST(event_json AS BLOB) FROM transcript_events "
                "WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (session_id, seq, limit)).fetchall()
        return [TranscriptRow(str(sid), int(n), None if raw is None
                              else bytes(raw).decode(errors="replace"))
                for sid, n, raw in rows]

    def find_text(self, session_key: str, needle: str) -> bool:
        """Whether a stored entry of a session under `session_key` contains `needle`."""
        if not self.exists():
            return False
        pattern = "%" + needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._reading() as db:
            found = db.execute(
                "SELECT 1 FROM transcript_events WHERE session_id IN "
                "(SELECT session_id FROM session_windows WHERE session_key = ?) "
                "AND event_json LIKE ? ESCAPE '\\' LIMIT 1", (session_key, pattern)).fetchone()
        return found is not None

    def turns(self, session_key: str) -> int:
        """A count that grows with each entry stored in the sessions under `session_key`
        (each turn adds some): the sum of their next seqs."""
        if not self.exists():
            return 0
        with self._reading() as db:
            return int(db.execute(
                "SELECT COALESCE(SUM(head + 1), 0) FROM (SELECT MAX(seq) AS head FROM "
                "transcript_events WHERE session_id IN (SELECT session_id FROM session_windows "
                "WHERE session_key = ?) GROUP BY session_id)", (session_key,)).fetchone()[0])

    def sizes(self) -> dict[str, Any]:
        """Bytes of the database, its WAL and the sessions folder, and the session count."""
        def size(path: Path) -> int:
            try:
                return path.stat().st_size
            except OSError:
                return 0

        folder_bytes = folder_files = 0
        if self.sessions_dir.is_dir():
            for entry in self.sessions_dir.rglob("*"):
                if entry.is_file() and not entry.is_symlink():
                    folder_files += 1
                    folder_bytes += size(entry)
        sessions = transcript_sessions = None
        if self.exists():
            with self._reading() as db:
                sessions = int(db.execute("SELECT COUNT(*) FROM session_nodes").fetchone()[0])
                transcript_sessions = int(
                    db.execute("SELECT COUNT(*) FROM session_windows").fetchone()[0])
        db_bytes = size(self.path)
        wal_bytes = size(self.path.with_name(self.path.name + "-wal"))
        return {"agent": self.agent, "db_bytes": db_bytes, "wal_bytes": wal_bytes,
                "archive_bytes": folder_bytes, "archive_files": folder_files,
                "total_bytes": db_bytes + wal_bytes + folder_bytes, "sessions": sessions,
                "transcript_sessions": transcript_sessions}
