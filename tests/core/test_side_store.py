"""The side store: values by namespace and key, with a time to live, read-only views."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from pulse_core import ManualClock, StoreClosed, StoreError
from pulse_core.store import SqliteSideStore


async def test_values_live_until_their_ttl_and_namespaces_stay_apart(tmp_path: Path) -> None:
    clock = ManualClock(1_000)
    side = await SqliteSideStore.open(tmp_path / "state.db", clock=clock)
    await side.put("quiet", {"ana": b"1", "bo": b"2"}, ttl_ms=500)
    await side.put("other", {"ana": b"kept"})
    assert await side.get_all("quiet") == {"ana": b"1", "bo": b"2"}
    clock.advance(499)
    assert set(await side.get_all("quiet")) == {"ana", "bo"}
    clock.advance(1)
    assert await side.get_all("quiet") == {}
    assert await side.get_all("other") == {"ana": b"kept"}
    await side.put("quiet", {"ana": b"3"})
    await side.delete("quiet", ["ana", "never-there"])
    assert await side.get_all("quiet") == {}
    await side.close()
    rows = sqlite3.connect(tmp_path / "state.db").execute("SELECT namespace, key FROM side")
    assert rows.fetchall() == [("other", "ana")]  # expired values went with the next write


async def test_side_state_survives_reopening(tmp_path: Path) -> None:
    side = await SqliteSideStore.open(tmp_path / "state.db")
    await side.put("quiet", {"ana": b"held"})
    await side.close()
    with pytest.raises(StoreClosed):
        await side.get_all("quiet")
    again = await SqliteSideStore.open(tmp_path / "state.db")
    assert await again.get_all("quiet") == {"ana": b"held"}
    await again.close()


async def test_a_read_only_side_store_reads_and_never_writes(tmp_path: Path) -> None:
    absent = await SqliteSideStore.open(tmp_path / "none.db", read_only=True)
    assert await absent.get_all("quiet") == {}
    with pytest.raises(StoreError, match="read-only"):
        await absent.put("quiet", {"ana": b"1"})
    await absent.close()
    assert not (tmp_path / "none.db").exists()
    writer = await SqliteSideStore.open(tmp_path / "state.db")
    await writer.put("quiet", {"ana": b"1"})
    reader = await SqliteSideStore.open(tmp_path / "state.db", read_only=True)
    await writer.put("quiet", {"bo": b"2"})
    assert await reader.get_all("quiet") == {"ana": b"1", "bo": b"2"}
    with pytest.raises(StoreError, match="read-only"):
        await reader.delete("quiet", ["ana"])
    await reader.close()
    await writer.close()
