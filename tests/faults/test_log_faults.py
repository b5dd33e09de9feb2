"""The event log's integrity under lost files, corrupt rows and hostile drafts (issue 9)."""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pulse_core import (
    EventDraft,
    EventLogLost,
    InvalidEvent,
    ObjectStore,
    PayloadNotEncodable,
    Projector,
    SqliteEventStore,
    open_home,
)
from pulse_core._effects import effect_draft
from pulse_core._events import MAX_DATA_DEPTH
from tests.faults.log_support import (
    ROOT,
    Job,
    Jobs,
    Notes,
    engine_at,
    note,
    notes_of,
    truncate,
    without_sidecars,
)

# -- Fault 1: checkpoints ahead of the log --------------------------------------------------


async def test_checkpoints_past_the_end_of_a_restored_log_are_discarded_and_rebuilt(
    tmp_path: Path,
) -> None:
    """Fault 1: a log restored from an older backup (or cut short by a lost -wal) is shorter
    than the checkpoints; they are discarded and rebuilt, so new events are folded and new
    effects run even where their seq is at or below the old checkpoints' cursor."""
    home = tmp_path / "home"
    cursor_before = await _restore_an_older_backup(home, later=30)
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
    cursor_before = await _restore_an_older_backup(home, later=20)
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


async def _restore_an_older_backup(home: Path, later: int) -> int:
    """Notes 1 and 2, a backup of the log, notes 3..later-1 and an effect run and folded (so
    the checkpoints at close reflect them), then the backup put back as a lost -wal would leave
    it; the seq the checkpoints reflect."""
    engine = engine_at(home)
    await engine.open()
    await engine.append([note(1), note(2)])
    await engine.close()
    backup = home.parent / "events.db.backup"
    shutil.copyfile(home / "events.db", backup)
    engine = engine_at(home)
    await engine.open()
    await engine.append([note(n) for n in range(3, later)])
    await engine.append([effect_draft(Job(n=0), origin="agent")])
    await engine.executor_loop.run_until_idle()
    assert len(await notes_of(engine)) == later - 1
    await engine.close()
    cursor = await _last_seq(home)
    shutil.copyfile(backup, home / "events.db")
    without_sidecars(home / "events.db")
    return cursor


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
    from tests.faults.log_support import Notes

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
            objects.delete_sync(f"{digest}\n")
        assert await store.last_seq() == 0 and objects.get_sync(digest) == b"payload"
    finally:
        await store.close()
