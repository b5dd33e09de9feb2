"""One engine per home: a second engine on a held home is refused, the holder carries on,
and once the holder has gone the home opens again."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pulse_core import Engine, HomeLocked

from .children.workload import PidJournalExecutor
from .support import (
    Child,
    assert_every_effect_finished_once,
    check_database,
    read_events,
    wait_until,
)


async def try_open(home: Path) -> None:
    """Open (and, if that works, close) an engine on `home`."""
    engine = Engine(home)
    await engine.open()
    await engine.close()


async def open_and_finish(home: Path, journal: Path) -> int:
    """Open an engine on `home`, run what the last one left, close; returns its first seq."""
    engine = Engine(home, executors=[PidJournalExecutor(journal, 0.0)])
    await engine.open()
    try:
        assert (home / "engine.lock").read_text() == str(os.getpid())
        first = await engine.events.last_seq()
        await asyncio.wait_for(engine.executor_loop.run_until_idle(), 10)
    finally:
        await engine.close()
    return first


@pytest.mark.slow
def test_second_engine_on_held_home_raises_home_locked_and_holder_keeps_running(
    tmp_path: Path, spawn: Callable[..., Child]
) -> None:
    home, journal = tmp_path / "home", tmp_path / "journal.txt"
    db = home / "events.db"
    holder = spawn("lock_child.py", home, journal)
    holder.wait_for_line("ready", 15)
    wait_until(lambda: len(read_events(db, {"effect-acked"})) >= 3, 10,
               "the holder to run effects", holder)
    seq_before = read_events(db)[-1].seq

    with pytest.raises(HomeLocked) as refused:
        asyncio.run(asyncio.wait_for(try_open(home), 10))
    message = str(refused.value)
    assert str(home) in message and f"pid {holder.pid}" in message, message

    # The refusal changed nothing: the holder still holds the lock, keeps ticking and
    # running effects, and the refused engine wrote nothing.
    assert (home / "engine.lock").read_text() == str(holder.pid)
    wait_until(lambda: len(read_events(db)) >= seq_before + 20, 10,
               "the holder's log to keep growing", holder)
    after = [e for e in read_events(db) if e.seq > seq_before]
    assert [e for e in after if e.kind == "tick"]
    acked_after = [e for e in after if e.kind == "effect-acked"]
    assert acked_after and {e.data["result"]["pid"] for e in acked_after} == {holder.pid}
    started = [e.data["pid"] for e in read_events(db, {"engine-started"})]
    assert started == [holder.pid]
    assert holder.alive(), holder.describe()
    check_database(db)

    # The holder stops on SIGTERM (closing cleanly), after which the home opens again.
    assert holder.stop() == 0, holder.describe()
    assert holder.lines()[-1] == "stopped", holder.describe()
    stopped = read_events(db, {"engine-stopped"})
    assert [e.data["pid"] for e in stopped] == [holder.pid]

    first_seq = asyncio.run(open_and_finish(home, journal))
    assert first_seq >= stopped[-1].seq
    events = read_events(db)
    lifecycle = [(e.kind, e.data["pid"]) for e in events
                 if e.kind in ("engine-started", "engine-stopped")]
    assert lifecycle == [("engine-started", holder.pid), ("engine-stopped", holder.pid),
                         ("engine-started", os.getpid()), ("engine-stopped", os.getpid())]
    # What the holder left unfinished at its stop, the next engine ran: nothing is lost.
    assert_every_effect_finished_once(events)
    errors = [e for e in events if e.kind == "error"]
    assert not errors, errors
    check_database(db)
