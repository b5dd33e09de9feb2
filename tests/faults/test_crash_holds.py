"""What held under SIGKILL in the hardening pass, kept as regression tests.

Each round kills a process at a random moment and then checks the log with plain sqlite3.
`PULSE_FAULT_ROUNDS` raises the number of rounds (CI runs the default few; the figures in
docs/guarantees.md came from long runs of the same tests).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from pulse_core import SqliteEventStore
from pulse_core._effects import effect_draft
from tests.e2e.children.workload import Work, read_journal
from tests.e2e.support import (
    Child,
    assert_every_effect_finished_once,
    by_key,
    check_database,
    read_events,
    wait_until,
)

ROUNDS = int(os.environ.get("PULSE_FAULT_ROUNDS", "3"))
CHILD = Path(__file__).resolve().parent / "children" / "appenders.py"


def _run_until_killed(home: Path, journal: Path, delay: float) -> None:
    proc = subprocess.Popen([sys.executable, str(CHILD), str(home), str(journal)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line == b"ready\n", (line, proc.stderr.read() if proc.stderr else b"")
    time.sleep(delay)
    if proc.poll() is not None:
        raise AssertionError(f"appenders exited early: {proc.communicate()[1].decode()}")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.stderr is not None
    proc.stderr.close()
    proc.stdout.close()


def _check_log(db: Path, journal: Path) -> tuple[int, int]:
    """Assert the log's invariants against the journal; returns (events, replayed retries)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT seq, key, version, idem, tx, data FROM events "
                           "WHERE kind = 'fault-op' ORDER BY seq").fetchall()
        seqs = [seq for (seq,) in con.execute("SELECT seq FROM events ORDER BY seq")]
    finally:
        con.close()
    assert seqs == list(range(1, len(seqs) + 1)), "seq has a gap"
    by_op: dict[tuple[int, int], list[tuple[str, str]]] = defaultdict(list)
    versions: dict[str, list[int]] = defaultdict(list)
    for _seq, key, version, idem, tx, data in rows:
        payload = json.loads(data)
        by_op[payload["w"], payload["i"]].append((idem, tx))
        versions[key].append(version)
        if not key.endswith("-side"):
            assert version == payload["i"] + 1, f"{key} op {payload['i']} at version {version}"
    for op, parts in by_op.items():
        assert len(parts) == 2, f"op {op} stored {len(parts)} of its 2 drafts"
        assert parts[0][1] == parts[1][1], f"op {op} split across transactions"
    for key, seen in versions.items():
        assert seen == list(range(1, len(seen) + 1)), f"{key} versions {seen[:10]}..."
    replayed = 0
    for line in journal.read_text().splitlines():
        fields = line.split()
        if fields[0] == "ok":
            assert (int(fields[1]), int(fields[2])) in by_op, f"acknowledged {line} is missing"
        elif fields[0] == "replayed":
            replayed += 1
        assert fields[0] != "conflict", f"an appender met a version conflict: {line}"
    return len(rows), replayed


def test_sigkill_during_concurrent_appends_loses_no_acknowledged_append_and_splits_none(
    tmp_path: Path,
) -> None:
    """24 appenders with idempotency keys and expected versions, killed ROUNDS times at random
    moments: every acknowledged append is stored whole, seq and versions have no gaps, and the
    retry of an append whose reply was lost writes nothing new when it had committed."""
    home, journal = tmp_path / "home", tmp_path / "journal"
    home.mkdir()
    rng = random.Random(9)
    for _ in range(ROUNDS):
        _run_until_killed(home, journal, rng.uniform(0.2, 0.8))
        _check_log(home / "events.db", journal)
    _run_until_killed(home, journal, 0.3)  # the last round's retries run and are checked
    events, replayed = _check_log(home / "events.db", journal)
    assert events > 100 * ROUNDS, f"only {events} events: the appenders barely ran"
    print(f"{ROUNDS + 1} kills, {events} events, {replayed} lost replies replayed")


def test_sigkill_of_executor_processes_loses_no_effect_and_acks_none_twice(
    tmp_path: Path,
) -> None:
    """Two executor processes share a stream of effects; one of them is SIGKILLed and replaced
    ROUNDS times: every effect is acked exactly once, no (effect, attempt) runs twice, and an
    effect runs again only under a new attempt number after its claimant died."""
    home, journal = tmp_path / "home", tmp_path / "journal.txt"
    home.mkdir()
    db = home / "events.db"
    asyncio.run(_create(db))
    rng = random.Random(55)
    children: list[Child] = []

    def start() -> Child:
        child = Child("loop_child.py", [str(home), str(journal), "--work-seconds", "0.05"],
                      tmp_path)
        children.append(child)
        child.wait_for_line("ready", 15)
        return child

    try:
        loops = [start(), start()]
        total = 0
        for _ in range(ROUNDS):
            acked = len(read_events(db, {"effect-acked"}))
            total += asyncio.run(_feed(db, 60))
            wait_until(lambda a=acked: len(read_events(db, {"effect-acked"})) >= a + 5, 30,
                       "work to be under way", *loops)
            time.sleep(rng.uniform(0.0, 0.05))
            victim = rng.randrange(2)
            loops[victim].kill()
            loops[victim] = start()
        total += asyncio.run(_feed(db, 60))
        wait_until(lambda: len(read_events(db, {"effect-acked"})) >= total, 60,
                   f"{total} acks", *loops)
        for loop in loops:
            assert loop.stop() == 0, loop.describe()
    finally:
        for child in children:
            child.close()

    events = read_events(db)
    assert sum(e.kind == "effect" for e in events) == total
    assert_every_effect_finished_once(events)
    assert not [e for e in events if e.kind == "effect-failed" and e.data.get("final")]
    runs = Counter((key, int(attempt)) for _pid, key, attempt in read_journal(journal))
    assert not [pair for pair, n in runs.items() if n > 1], "an (effect, attempt) ran twice"
    retried = 0
    for key, group in by_key(events).items():
        claims = [e.data["attempt"] for e in group if e.kind == "effect-executing"]
        assert claims == list(range(1, len(claims) + 1)), (key, claims)
        retried += len(claims) > 1
    assert retried, "no kill landed while an effect ran: the takeover went untested"
    print(f"{ROUNDS} kills, {total} effects, {retried} taken over after their claimant died")
    check_database(db)


async def _create(db: Path) -> None:
    store = await SqliteEventStore.open(db)
    await store.close()


async def _feed(db: Path, count: int) -> int:
    store = await SqliteEventStore.open(db)
    try:
        await store.append([effect_draft(Work(n=n), origin="agent") for n in range(count)])
    finally:
        await store.close()
    return count
