"""What held in the hardening pass: readers following the log, in the writer's process and in
another process, see every event of many concurrent appenders once, in seq order."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from pulse_core import EventDraft, register_kind
from pulse_core.store import SqliteEventStore

register_kind("fault-read", "one append of a reader-test appender")

APPENDERS = 50
EACH = 40
TOTAL = APPENDERS * EACH
FOLLOWER = Path(__file__).resolve().parent / "children" / "follower.py"


async def _append_and_follow(db: Path) -> list[int]:
    store = await SqliteEventStore.open(db)
    seen: list[int] = []

    async def follow() -> None:
        async for event in store.changes(poll_interval=5.0):  # woken by commits, not polling
            seen.append(event.seq)
            if len(seen) == TOTAL:
                return

    async def appender(n: int) -> None:
        for i in range(EACH):
            await store.append([EventDraft("fault-read", f"a{n}", {"i": i})],
                               expect={f"a{n}": i})

    try:
        reader = asyncio.create_task(follow())
        await asyncio.gather(*(appender(n) for n in range(APPENDERS)))
        await asyncio.wait_for(reader, 30)
    finally:
        await store.close()
    return seen


async def _create(db: Path) -> None:
    store = await SqliteEventStore.open(db)
    await store.close()


def test_readers_in_and_out_of_process_see_every_concurrent_append_once_in_order(
    tmp_path: Path,
) -> None:
    """Fault (held): 50 appenders at once; a change cursor in the writer's process and one in
    another process (read-only) each see seq 1..N exactly once, in order."""
    db = tmp_path / "events.db"
    asyncio.run(_create(db))
    follower = subprocess.Popen([sys.executable, str(FOLLOWER), str(db), "--until", str(TOTAL)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "ready\n"
        seen_here = asyncio.run(_append_and_follow(db))
        out, err = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    expected = list(range(1, TOTAL + 1))
    assert seen_here == expected
    assert [int(line) for line in out.split()] == expected
