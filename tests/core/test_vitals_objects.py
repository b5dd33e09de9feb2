"""vitals.db windows, cursors, retention and read-only views; objects/ atomic, deduplicated
writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pulse_core import ManualClock, ObjectStore, Retention, StoreError, VitalsStore
from pulse_core._errors import NotAPulseDatabase, PayloadNotEncodable
from pulse_core.store import SqliteVitalsStore, digest_of


async def test_windows_latest_and_errors(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000)
    vitals = await VitalsStore.open(tmp_path / "vitals.db", clock=clock)
    for i in range(5):
        await vitals.record("cpu", {"pct": i * 10})
        clock.advance(1_000)
    await vitals.record("disk", error="permission denied")
    window = await vitals.window("cpu", clock.now_ms() - 2_500)
    assert [s.data["pct"] for s in window] == [30, 40]
    latest = await vitals.latest()
    assert latest["cpu"].data == {"pct": 40}
    assert not latest["disk"].ok and latest["disk"].error == "permission denied"
    with pytest.raises(PayloadNotEncodable, match="cpu"):
        await vitals.record("cpu", {"bad": object()})
    await vitals.close()


async def test_gc_removes_by_age_and_count_in_bounded_batches(tmp_path: Path) -> None:
    clock = ManualClock(0)
    vitals = await VitalsStore.open(tmp_path / "vitals.db", clock=clock)
    for i in range(30):
        await vitals.record("old", i, ts=i)
    clock.advance(100_000)
    for i in range(20):
        await vitals.record("busy", i)
        clock.advance(1)
    policy = Retention(max_age_ms=50_000, max_per_key=5, batch=10)
    assert [await vitals.gc(policy) for _ in range(6)] == [10, 10, 10, 10, 5, 0]
    assert await vitals.window("old", 0) == []
    assert (await vitals.latest(["old"]))["old"].data == 29  # the last reading outlives gc
    assert [s.data for s in await vitals.window("busy", 0)] == [15, 16, 17, 18, 19]
    await vitals.close()


async def test_vitals_refuses_a_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "vitals.db"
    path.write_text("hello")
    with pytest.raises(NotAPulseDatabase):
        await VitalsStore.open(path)


def test_objects_are_named_by_content_and_stored_once(tmp_path: Path) -> None:
    objects = ObjectStore(tmp_path)
    digest = objects.put_sync(b"payload")
    assert digest == digest_of(b"payload")
    assert objects.put_sync(b"payload") == digest
    assert objects.get_sync(digest) == b"payload"
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files == [objects.path_of(digest)]
    with pytest.raises(ValueError, match="not a SHA-256"):
        objects.path_of("../../etc/passwd")


async def test_since_returns_each_sample_once_by_key_oldest_first(tmp_path: Path) -> None:
    clock = ManualClock(1_000)
    vitals = await VitalsStore.open(tmp_path / "vitals.db", clock=clock)
    await vitals.record("cpu", 1)
    start = await vitals.cursor()
    await vitals.record("cpu", 2)
    await vitals.record("disk", error="gone")
    await vitals.record("cpu", 0, ts=500)  # recorded late, taken earlier
    cursor, found = await vitals.since(start)
    assert [s.data for s in found["cpu"]] == [0, 2]
    assert [s.error for s in found["disk"]] == ["gone"]
    assert cursor == await vitals.cursor() > start
    assert await vitals.since(cursor) == (cursor, {})
    await vitals.close()


async def test_gc_never_hands_an_id_out_twice(tmp_path: Path) -> None:
    clock = ManualClock(0)
    vitals = await VitalsStore.open(tmp_path / "vitals.db", clock=clock)
    for i in range(5):
        await vitals.record("old", i)
    cursor = await vitals.cursor()
    clock.advance(10_000)
    await vitals.gc(Retention(max_age_ms=1_000, max_per_key=1, batch=100))
    await vitals.record("new", "after gc")
    _, found = await vitals.since(cursor)
    assert [s.data for s in found["new"]] == ["after gc"]
    await vitals.close()


async def test_a_read_only_vitals_store_reads_and_never_writes(tmp_path: Path) -> None:
    absent = await SqliteVitalsStore.open(tmp_path / "none.db", read_only=True)
    assert await absent.latest() == {} and await absent.cursor() == 0
    with pytest.raises(StoreError, match="read-only"):
        await absent.record("cpu", 1)
    await absent.close()
    assert not (tmp_path / "none.db").exists()
    writer = await SqliteVitalsStore.open(tmp_path / "vitals.db")
    await writer.record("cpu", 1)
    reader = await SqliteVitalsStore.open(tmp_path / "vitals.db", read_only=True)
    await writer.record("cpu", 2)
    assert [s.data for s in await reader.window("cpu", 0)] == [1, 2]
    with pytest.raises(StoreError, match="read-only"):
        await reader.gc()
    await reader.close()
    await writer.close()


def test_a_read_only_object_store_creates_and_writes_nothing(tmp_path: Path) -> None:
    objects = ObjectStore(tmp_path / "objects", read_only=True)
    assert not (tmp_path / "objects").exists()
    with pytest.raises(StoreError, match="read-only"):
        objects.put_sync(b"payload")
    writable = ObjectStore(tmp_path / "objects")
    digest = writable.put_sync(b"payload")
    assert objects.get_sync(digest) == b"payload" and objects.put_sync(b"payload") == digest
    with pytest.raises(StoreError, match="read-only"):
        objects.delete_sync(digest)
