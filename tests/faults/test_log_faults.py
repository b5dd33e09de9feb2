"""The event log's integrity under lost files, corrupt rows and hostile drafts (issue 9)."""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pulse_core import (
    Effect,
    Engine,
    Event,
    EventDraft,
    EventLogLost,
    EventUnreadable,
    ExecutionContext,
    Executor,
    InvalidEvent,
    LoopState,
    ObjectStore,
    PayloadNotEncodable,
    Projection,
    Projector,
    SqliteEventStore,
    StoreReadOnly,
    UnreadableEvent,
    open_home,
    purge_payload,
    register_kind,
)
from pulse_core._effects import effect_draft
from pulse_core._events import MAX_DATA_DEPTH
from pulse_survival import Notify
from tests.cli.runner import Upulse

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


# -- Fault 1: checkpoints ahead of the log --------------------------------------------------


async def test_checkpoints_past_the_end_of_a_restored_log_are_discarded_and_rebuilt(
    tmp_path: Path,
) -> None:
    """Fault 1: a log restored from an older backup (or cut short by a lost -wal) is shorter
    than the checkpoints; they are discarded and rebuilt, so new events are folded and new
    effects run even where their seq is at or below the old checkpoints' cursor."""
    home = tmp_path / "home"
    engine = engine_at(home)
    await engine.open()
    await engine.append([note(1), note(2)])
    await engine.close()
    backup = tmp_path / "events.db.backup"
    shutil.copyfile(home / "events.db", backup)

    engine = engine_at(home)
    await engine.open()
    await engine.append([note(n) for n in range(3, 30)])
    await engine.append([effect_draft(Job(n=0), origin="agent")])
    await engine.executor_loop.run_until_idle()
    assert len(await notes_of(engine)) == 29  # folded: the checkpoints at close reflect it
    await engine.close()
    cursor_before = await _last_seq(home)
    shutil.copyfile(backup, home / "events.db")
    without_sidecars(home / "events.db")
    assert await _last_seq(home) < cursor_before

    jobs = Jobs()
    engine = engine_at(home, jobs)
    await engine.open()
    try:
        assert await notes_of(engine) == (1, 2)
        new = await engine.append([note(99), effect_draft(Job(n=7), origin="agent")])
        assert new.events[-1].seq < cursor_before  # the old cursor would have hidden it
        await engine.executor_loop.run_until_idle()
        assert jobs.ran == [7]
        assert await notes_of(engine) == (1, 2, 99)
        discarded = await engine.events.read(kinds=["checkpoint-discarded"])
        names = {e.data["name"] for e in discarded}
        assert {"fault-notes", "executor-loop"} <= names
        assert all(e.data["seq"] > e.data["last_seq"] for e in discarded)
    finally:
        await engine.close()


async def test_checkpoints_of_a_restored_log_that_has_grown_past_them_are_rebuilt(
    tmp_path: Path,
) -> None:
    """Fault 1 (a variant the first fix missed): a log restored from a backup and written
    again until it is longer than the checkpoints' seq looked like the same log; the folds
    showed events it no longer holds and skipped new ones. A checkpoint now names the event at
    its seq, and another event there means another log."""
    home = tmp_path / "home"
    engine = engine_at(home)
    await engine.open()
    await engine.append([note(1), note(2)])
    await engine.close()
    backup = tmp_path / "events.db.backup"
    shutil.copyfile(home / "events.db", backup)

    engine = engine_at(home)
    await engine.open()
    await engine.append([note(n) for n in range(3, 20)])
    await engine.executor_loop.refresh()
    assert len(await notes_of(engine)) == 19  # folded: the checkpoints at close reflect it
    await engine.close()
    cursor_before = await _last_seq(home)
    shutil.copyfile(backup, home / "events.db")
    without_sidecars(home / "events.db")
    store = await SqliteEventStore.open(home / "events.db")  # written again before the engine
    try:
        await store.append([effect_draft(Job(n=5), origin="agent")])
        await store.append([note(n) for n in range(100, 130)])
        assert await store.last_seq() > cursor_before
    finally:
        await store.close()

    jobs = Jobs()
    engine = engine_at(home, jobs)
    await engine.open()
    try:
        assert await notes_of(engine) == (1, 2, *range(100, 130))
        await engine.executor_loop.run_until_idle()
        assert jobs.ran == [5]
        discarded = await engine.events.read(kinds=["checkpoint-discarded"])
        assert {"fault-notes", "executor-loop"} <= {e.data["name"] for e in discarded}
    finally:
        await engine.close()


async def _last_seq(home: Path) -> int:
    store = await SqliteEventStore.open(home / "events.db", read_only=True)
    try:
        return await store.last_seq()
    finally:
        await store.close()


async def test_an_emptied_event_log_beside_checkpoints_refuses_to_open(tmp_path: Path) -> None:
    """Fault 1: events.db truncated to 0 bytes while checkpoints/ remains: the engine and
    open_home for writing refuse with EventLogLost saying what to do; deleting checkpoints/
    starts a new log deliberately."""
    engine = engine_at(tmp_path)
    await engine.open()
    await engine.append([note(n) for n in range(5)])
    assert len(await notes_of(engine)) == 5
    await engine.close()
    assert any((tmp_path / "checkpoints").glob("*.ckpt"))
    truncate(tmp_path / "events.db")

    with pytest.raises(EventLogLost) as lost:
        await engine_at(tmp_path).open()
    message = str(lost.value)
    assert "events.db" in message and "checkpoints" in message
    assert "backup" in message and "delete" in message
    with pytest.raises(EventLogLost):
        await open_home(tmp_path)
    reader = await open_home(tmp_path, read_only=True)  # reading never refuses
    await reader.close()

    shutil.rmtree(tmp_path / "checkpoints")
    engine = engine_at(tmp_path)
    await engine.open()
    try:
        assert await notes_of(engine) == ()
    finally:
        await engine.close()


CRASH_AFTER_CHECKPOINT = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path
    from pulse_core import EventDraft, Projector, open_home, register_kind
    from tests.faults.test_log_faults import Notes

    async def main(home):
        stores = await open_home(home)
        await stores.events.append([EventDraft("fault-note", "n", {"n": n}) for n in range(9)])
        projector = Projector(stores.events, [Notes()], checkpoints=Path(home) / "checkpoints")
        await projector.catch_up()
        await projector.checkpoint()
        os._exit(0)  # a crash: nothing closed, the commits are still in events.db-wal

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_log_that_lost_its_wal_after_a_crash_refuses_to_open(tmp_path: Path) -> None:
    """Fault 1: a process crashes with its commits still in events.db-wal, and the -wal is
    then lost: the log reopens empty beside checkpoints, and the engine refuses to open."""
    child = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", CRASH_AFTER_CHECKPOINT, str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert child.returncode == 0, child.stderr
    assert without_sidecars(tmp_path / "events.db")  # the commits were only in the -wal

    with pytest.raises(EventLogLost, match="fault-notes at #9"):
        await engine_at(tmp_path).open()


async def test_a_projector_rebuilds_only_the_folds_whose_checkpoint_is_ahead(
    tmp_path: Path,
) -> None:
    """Fault 1: the Projector on its own: a checkpoint past the log's newest seq is
    discarded (its file deleted, a checkpoint-discarded event recorded) and that fold
    rebuilt from the log."""
    folder = tmp_path / "checkpoints"
    big = await SqliteEventStore.open(tmp_path / "big.db")
    await big.append([note(n) for n in range(20)])
    projector = Projector(big, [Notes()], checkpoints=folder)
    await projector.catch_up()
    await projector.checkpoint()
    await big.close()

    small = await SqliteEventStore.open(tmp_path / "small.db")
    try:
        await small.append([note(100), note(101)])
        states = await Projector(small, [Notes()], checkpoints=folder).catch_up()
        assert states["fault-notes"] == (100, 101)
        (discarded,) = await small.read(kinds=["checkpoint-discarded"])
        assert discarded.data == {"name": "fault-notes", "seq": 20, "last_seq": 2}
        assert not (folder / "fault-notes.ckpt").exists()
    finally:
        await small.close()


async def test_a_disk_that_refuses_checkpoints_costs_no_tick(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Fault 2 (the projector's share): a checkpoint the disk refuses raised out of every
    catch_up, so every tick (survival included) failed while the disk refused; now it is
    logged once and folds go on."""
    folder = tmp_path / "checkpoints"
    folder.write_text("a file where the folder should be")
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        projector = Projector(store, [Notes()], checkpoints=folder, checkpoint_interval=0.0)
        with caplog.at_level(logging.WARNING, logger="pulse"):
            for n in range(3):
                await store.append([note(n)])
                states = await projector.catch_up()
        assert states["fault-notes"] == (0, 1, 2)
        assert caplog.text.count("cannot write the projections' checkpoints") == 1
    finally:
        await store.close()


# -- Fault 4: one corrupt byte in one event's JSON ------------------------------------------


def corrupt_data_of(db: Path, marker: str) -> None:
    """Overwrite the closing brace of the one event whose data holds `marker`, in the file
    itself (as a bad disk or a stray write would), and check SQLite still finds the file
    intact."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    without_sidecars(db)
    raw = bytearray(db.read_bytes())
    needle = f'"{marker}"}}'.encode()
    assert raw.count(needle) == 1
    raw[raw.index(needle) + len(needle) - 1] = ord("#")
    db.write_bytes(bytes(raw))
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()


async def test_a_corrupt_event_is_a_typed_error_naming_its_seq_and_a_listed_row(
    tmp_path: Path,
) -> None:
    """Fault 4: a reader that may not write gets EventUnreadable naming the row's seq (never
    a bare msgspec.DecodeError), and read_rows lists the row as unreadable in its place."""
    db = tmp_path / "events.db"
    store = await SqliteEventStore.open(db)
    await store.append([note(n, text=f"row-{n}") for n in range(1, 6)])
    await store.close()
    corrupt_data_of(db, "row-3")

    reader = await SqliteEventStore.open(db, read_only=True)
    try:
        with pytest.raises(EventUnreadable) as info:
            await reader.read()
        assert info.value.seq == 3 and "#3" in str(info.value)
        assert [e.seq for e in await reader.read(3)] == [4, 5]
        rows = await reader.read_rows()
        assert [r.seq for r in rows] == [1, 2, 3, 4, 5]
        bad = rows[2]
        assert isinstance(bad, UnreadableEvent)
        assert (bad.kind, bad.key) == ("fault-note", "note-3") and "data" in bad.reason
        newest = await reader.read_rows(newest_first=True, limit=3)
        assert [r.seq for r in newest] == [5, 4, 3]
    finally:
        await reader.close()


async def test_a_writable_store_quarantines_a_corrupt_event_and_every_read_skips_it(
    tmp_path: Path,
) -> None:
    """Fault 4: the first read of a writable store that meets the row appends one
    event-quarantined naming it; from then on every read, page and change cursor (of any
    process, read-only ones included) leaves it out and pages still fill up to their limit."""
    db = tmp_path / "events.db"
    store = await SqliteEventStore.open(db)
    await store.append([note(n, text=f"row-{n}") for n in range(1, 8)])
    await store.close()
    corrupt_data_of(db, "row-2")

    store = await SqliteEventStore.open(db)
    try:
        pages = [[e.seq for e in page.events]
                 async for page in store.pages(kinds=["fault-note"], limit=2)]
        assert pages == [[1, 3], [4, 5], [6, 7], []]
        (quarantine,) = await store.read(kinds=["event-quarantined"])
        assert quarantine.key == "note-2"  # the row's own key: its version moves past it
        assert quarantine.data["seq"] == 2 and quarantine.data["kind"] == "fault-note"
        assert [e.seq for e in await store.read(limit=3)] == [1, 3, 4]
        seen: list[int] = []
        async for event in store.changes(kinds=["fault-note"], batch=2):
            seen.append(event.seq)
            if event.seq == 7:
                break
        assert seen == [1, 3, 4, 5, 6, 7]
        assert len(await store.read(kinds=["event-quarantined"])) == 1
    finally:
        await store.close()
    reader = await SqliteEventStore.open(db, read_only=True)
    try:
        assert [e.seq for e in await reader.read(kinds=["fault-note"])] == [1, 3, 4, 5, 6, 7]
    finally:
        await reader.close()


async def test_an_engine_opens_ticks_and_runs_survival_beside_a_corrupt_event(
    tmp_path: Path,
) -> None:
    """Fault 4: Engine.open() no longer dies on the row: the fold quarantines it, ticks run
    with every survival rule reached, effects still run, and the loops keep running."""
    engine = engine_at(tmp_path)
    await engine.open()
    await engine.append([note(1, text="keep"), note(2, text="spoil"), note(3, text="keep-too")])
    await engine.close()
    shutil.rmtree(tmp_path / "checkpoints")  # the fold must read the row again
    corrupt_data_of(tmp_path / "events.db", "spoil")

    jobs = Jobs()
    engine = engine_at(tmp_path, jobs)
    await engine.open()
    try:
        assert await notes_of(engine) == (1, 3)
        (quarantine,) = await engine.events.read(kinds=["event-quarantined"])
        assert quarantine.data["key"] == "note-2"
        await engine.append([effect_draft(Job(n=5), origin="agent")])
        await engine.step()
        assert jobs.ran == [5]
        survival = [t for t in engine.trace if t.tier == "survival"]
        assert survival and all(t.reached and t.error is None for t in survival)
        await engine.start()
        await asyncio.sleep(0.2)
        assert all(s.state is LoopState.RUNNING and s.restarts == 0 for s in engine.loops())
        assert not await engine.events.read(kinds=["error"])
    finally:
        await engine.close()


async def test_quarantine_by_hand_names_only_an_unreadable_row(tmp_path: Path) -> None:
    """Fault 4: EventStore.quarantine marks an unreadable row once (again returns the same
    event) and refuses a readable row, a row that does not exist, and a read-only store."""
    db = tmp_path / "events.db"
    store = await SqliteEventStore.open(db)
    await store.append([note(1, text="fine"), note(2, text="spoil")])
    await store.close()
    corrupt_data_of(db, "spoil")

    reader = await SqliteEventStore.open(db, read_only=True)
    with pytest.raises(StoreReadOnly):
        await reader.quarantine(2, "bad disk")
    await reader.close()
    store = await SqliteEventStore.open(db)
    try:
        with pytest.raises(InvalidEvent, match="can be read"):
            await store.quarantine(1, "no reason")
        with pytest.raises(InvalidEvent, match="no event #9"):
            await store.quarantine(9, "no reason")
        first = await store.quarantine(2, "bad disk")
        assert isinstance(first, Event)
        assert (first.kind, first.data["reason"], first.origin) == (
            "event-quarantined", "bad disk", "human")
        again = await store.quarantine(2, "another reason")
        assert again.seq == first.seq
        assert [e.seq for e in await store.read(kinds=["fault-note"])] == [1]
    finally:
        await store.close()

    corrupt_data_of(db, "bad disk")  # now the quarantine record itself cannot be read
    store = await SqliteEventStore.open(db)
    try:
        assert [e.seq for e in await store.read()] == [1]  # and quarantines #3 by #4
        (record,) = await store.read(1)
        assert (record.seq, record.key, record.data["seq"]) == (4, "note-2", 3)
        assert isinstance(await store.quarantine(2, "again"), UnreadableEvent)
    finally:
        await store.close()


# -- Fault 11: a draft SQLite cannot store ---------------------------------------------------


async def test_a_draft_sqlite_cannot_store_fails_only_its_own_append(tmp_path: Path) -> None:
    """Fault 11: drafts with a cause past SQLite's integers, lone surrogates in key, origin,
    idem or an expected key, or fields of the wrong type, each fail their own append with
    InvalidEvent; the good appends of the same group commit are stored."""
    store = await SqliteEventStore.open(tmp_path / "events.db")
    bad: list[tuple[list[EventDraft], dict[str, int] | None]] = [
        ([EventDraft("fault-note", "k", {"n": 0}, cause=10**30)], None),
        ([EventDraft("fault-note", "k", {"n": 0}, cause=True)], None),
        ([EventDraft("fault-note", "k", {"n": 0}, cause=0)], None),
        ([EventDraft("fault-note", "k\udc80", {"n": 0})], None),
        ([EventDraft("fault-note", "k", {"n": 0}, origin="agent:\ud800")], None),
        ([EventDraft("fault-note", "k", {"n": 0}, idem="req-\udfff")], None),
        ([EventDraft("fault-note", "k", {"n": 0})], {"\udc80": 0}),
        ([EventDraft(7, "k", {"n": 0})], None),  # type: ignore[arg-type]
        ([EventDraft("fault-note", 7, {"n": 0})], None),  # type: ignore[arg-type]
        ([EventDraft("fault-note", "k", {"n": 0}, idem=7)], None),  # type: ignore[arg-type]
        ([EventDraft("fault-note", "k", {"n": 0}, attachment="text")], None),  # type: ignore[arg-type]
    ]
    try:
        appends = [store.append([note(0)])]  # opens a commit; the rest queue for the next
        for n, (drafts, expect) in enumerate(bad, start=1):
            appends.append(store.append([note(100 + n)]))
            appends.append(store.append(drafts, expect))
        outcomes = await asyncio.gather(*appends, return_exceptions=True)
        good, refused = [outcomes[0], *outcomes[1::2]], outcomes[2::2]
        assert all(isinstance(o, InvalidEvent) for o in refused), refused
        assert not any(isinstance(o, BaseException) for o in good), good
        assert "cause" in str(refused[0]) and "surrogate" in str(refused[3])
        stored = await store.read()
        assert sorted(e.data["n"] for e in stored) == [0, *range(101, 101 + len(bad))]
    finally:
        await store.close()


# -- Faults 18 and 19: data JSON cannot hold faithfully --------------------------------------


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


class Reading(msgspec.Struct):
    value: float


@pytest.mark.parametrize("data", [
    {"x": math.nan}, {"x": math.inf}, [1.0, -math.inf], {"blob": b"\x00\x01"},
    {"blob": bytearray(b"ab")}, {"deep": [{"in": memoryview(b"x")}]}, Reading(value=math.nan),
    {math.nan: 1},
], ids=["nan", "inf", "minus-inf", "bytes", "bytearray", "memoryview", "struct-nan", "nan-key"])
async def test_nan_infinities_and_bytes_in_event_data_are_refused(
    tmp_path: Path, data: Any
) -> None:
    """Fault 19: msgspec would store NaN and infinities as null and bytes as base64 text and
    report success; they are refused with PayloadNotEncodable and nothing is stored."""
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        with pytest.raises(PayloadNotEncodable, match="draft 1"):
            await store.append([note(1), EventDraft("fault-note", "k", data)])
        assert await store.last_seq() == 0
    finally:
        await store.close()


async def test_deeply_nested_event_data_is_a_typed_error_not_a_recursion_error(
    tmp_path: Path,
) -> None:
    """Fault 18: data nested past MAX_DATA_DEPTH (and far past Python's recursion limit) is
    refused with PayloadNotEncodable; data at the limit is stored and read back."""
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        for depth in (MAX_DATA_DEPTH + 1, 100_000):
            with pytest.raises(PayloadNotEncodable, match=f"deeper than {MAX_DATA_DEPTH}"):
                await store.append([EventDraft("fault-note", "deep", nested(depth))])
        with pytest.raises(PayloadNotEncodable):
            await store.append([EventDraft("fault-note", "deep", {"n": nested(MAX_DATA_DEPTH)})])
        await store.append([EventDraft("fault-note", "deep", nested(MAX_DATA_DEPTH - 1))])
        (stored,) = await store.read()
        assert stored.data == nested(MAX_DATA_DEPTH - 1)
    finally:
        await store.close()


# -- Fault 24: object digests ---------------------------------------------------------------


async def test_an_object_digest_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    """Fault 24: a digest must be exactly 64 lowercase hex digits; one with a trailing
    newline (which `$` lets through) is refused before any file or event is touched."""
    objects = ObjectStore(tmp_path / "objects")
    digest = objects.put_sync(b"payload")
    for bad in (f"{digest}\n", f"\n{digest}", digest.upper(), digest[:-1]):
        with pytest.raises(ValueError, match="not a SHA-256"):
            objects.path_of(bad)
        with pytest.raises(ValueError):
            objects.exists(bad)
    store = await SqliteEventStore.open(tmp_path / "events.db", objects=objects)
    try:
        with pytest.raises(ValueError):
            await purge_payload(store, objects, f"{digest}\n", reason="test")
        assert await store.last_seq() == 0 and objects.get_sync(digest) == b"payload"
    finally:
        await store.close()


def test_upulse_lists_a_corrupt_row_and_a_daemon_quarantines_it_and_runs(
    tmp_path: Path,
) -> None:
    """Fault 4 (the CLI's share): `upulse events` and `daemon start` failed with a bare
    msgspec.DecodeError; now the listing shows the row as unreadable, and a daemon starts,
    quarantines it (its executor loop folds every effect) and runs."""
    upulse = Upulse(tmp_path)
    home = upulse.init(tmp_path / "home")
    effect = effect_draft(Notify(topic="t", level="info", text="row-2"), origin="agent")
    asyncio.run(_append_notes(home, [note(1), effect, note(3)]))
    corrupt_data_of(home / "events.db", "row-2")
    try:
        listing = upulse("events", "--home", home)
        [row] = [line for line in listing.stdout.splitlines() if "UNREADABLE" in line]
        assert row.split()[0] == "2" and row.split()[3] == "effect", listing.stdout
        rows = upulse.json("events", "--home", home)
        assert isinstance(rows, list)
        assert [r["seq"] for r in rows if r.get("unreadable")] == [2]

        upulse("daemon", "start", "--home", home)
        quarantined = upulse.json("events", "--home", home, "--kind", "event-quarantined")
        assert isinstance(quarantined, list)
        assert [q["data"]["seq"] for q in quarantined] == [2]
        status = upulse("daemon", "status", "--home", home)
        assert "running" in status.stdout, status.stdout
    finally:
        upulse.stop_all()


async def _append_notes(home: Path, drafts: list[EventDraft]) -> None:
    store = await SqliteEventStore.open(home / "events.db")
    try:
        await store.append(drafts)
    finally:
        await store.close()
