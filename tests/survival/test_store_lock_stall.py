"""While another process holds events.db's write lock, the engine's loop keeps turning: the
survival rules decide, reads answer, and the tick's append commits once the lock is free.

The lock is held by a real second process (`BEGIN EXCLUSIVE` on the same file) until the
test tells it to let go; nothing here is timed: the test waits for events, and asserts what
happened while the lock was held.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pulse_core import Engine, ManualClock
from pulse_survival import Essential, ProcessPolicy, SurvivalConfig
from tests.timing import eventually, scaled

HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN EXCLUSIVE")
print("held", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
conn.close()
"""
NAME = "w"


def config() -> SurvivalConfig:
    """One essential process nothing on this machine matches: each tick decides its restart."""
    spec = Essential(name=NAME, argv=(sys.executable, "-c", "pass", uuid.uuid4().hex),
                     match_name="no-such-w")
    return SurvivalConfig(processes=(spec,), process=ProcessPolicy(
        startsecs=1, startretries=3, budget_per_hour=50, backoff_initial_s=1,
        backoff_max_s=60))


async def hold_lock(db: Path) -> asyncio.subprocess.Process:
    """A process holding `db`'s write lock until a line is written to its stdin."""
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, str(db), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    assert holder.stdout is not None
    line = await asyncio.wait_for(holder.stdout.readline(), scaled(30))
    assert line.strip() == b"held"
    return holder


async def release(holder: asyncio.subprocess.Process) -> None:
    assert holder.stdin is not None
    holder.stdin.write(b"go\n")
    await holder.stdin.drain()
    assert await asyncio.wait_for(holder.wait(), scaled(30)) == 0


async def test_survival_rules_decide_and_the_loop_turns_while_another_process_holds_the_lock(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    clock = ManualClock()
    engine: Engine = await open_engine(tmp_path / "home", clock=clock, survival=config())
    await engine.append([])  # the log is open and writable before the lock is taken
    # A write waits up to 30 s for the lock: far longer than the loop may ever stop for.
    engine.events.recorder.busy_timeout = 30.0
    turns, longest, last = 0, 0.0, time.monotonic()

    async def heartbeat() -> None:
        nonlocal turns, longest, last
        while True:
            await asyncio.sleep(0.001)
            now = time.monotonic()
            turns, longest, last = turns + 1, max(longest, now - last), now

    beating = asyncio.create_task(heartbeat())
    holder = await hold_lock(Path(engine.events.recorder.location))
    try:
        trace_before = engine.ticker.trace
        await engine.vitals.record("process-alive", {NAME: {
            "alive": False, "pid": None, "uptime_s": 0.0, "restarts_seen": 0}})
        tick = asyncio.create_task(engine.tick())
        # The chain runs and decides the restart; its append waits for the lock, off the loop.
        await eventually(lambda: engine.ticker.trace is not trace_before,
                         what="the survival rules ran while the lock was held")
        decided = {t.rule for t in engine.ticker.trace}
        assert decided, "the chain ran no rule"
        seen = turns
        await eventually(lambda: turns >= seen + 50,
                         what="the loop kept turning while the tick's append waited")
        page = await engine.events.read_page(limit=1)  # reads are answered meanwhile
        assert page.last_seq >= 0
        assert not tick.done(), "the tick's append committed while another process held the lock"
        # Not a speed check: a loop that waited for the lock would stop for the 30 s above.
        assert longest < scaled(5), f"the loop stopped for {longest:.1f} s during the hold"
    finally:
        await release(holder)
    decision = await asyncio.wait_for(tick, scaled(30))
    beating.cancel()
    assert any(type(e).tag() == "restart-process" for e in decision.effects)
    stored = await engine.events.read(kinds=["effect"])
    assert [e.data["effect"]["type"] for e in stored] == ["restart-process"]
    # Appends are back on their quick path: the next one commits and is read back.
    result = await engine.append([])
    assert result.events == ()
