"""A locked database and a full disk: typed errors, and nothing already stored is lost."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pulse_core import SqliteEventStore, StoreUnavailable
from tests.core.store_contract import draft


async def test_a_database_locked_by_another_writer_is_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    store = await SqliteEventStore.open(path, busy_timeout=0.2)
    await store.append([draft("kept")])
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreUnavailable, match="locked"):
        await store.append([draft("blocked")])
    blocker.execute("ROLLBACK")
    blocker.close()
    assert (await store.append([draft("after")])).events[0].seq == 2
    assert [e.key for e in await store.read()] == ["kept", "after"]
    await store.close()


FULL_DISK_CHILD = textwrap.dedent(
    """
    import asyncio, os, resource, signal, sys
    from pulse_core import EventDraft, SqliteEventStore, StoreUnavailable

    async def main(path):
        store = await SqliteEventStore.open(path)
        await store.append([EventDraft("tick", "warm", {"n": 0})])
        size = os.path.getsize(path) + os.path.getsize(path + "-wal")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 200_000, size + 200_000))
        acked = 1
        try:
            for i in range(10_000):
                await store.append([EventDraft("tick", f"k{i}", {"pad": "x" * 4000})])
                acked += 1
        except StoreUnavailable as exc:
            print("ERROR", type(exc).__name__, exc, file=sys.stderr)
            print(acked)
            return
        print("never full")

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_full_disk_is_a_typed_error_and_acknowledged_events_survive(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.db"
    child = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", FULL_DISK_CHILD, str(path)],
        check=False, capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert "StoreUnavailable" in child.stderr and str(path) in child.stderr
    acked = int(child.stdout.strip())
    assert acked > 1
    store = await SqliteEventStore.open(path)
    events = await store.read()
    assert len(events) == acked
    assert [e.seq for e in events] == list(range(1, acked + 1))
    await store.close()
