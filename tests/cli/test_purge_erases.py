"""A purge erases: element text is sealed with a key per element (keys.db, never in a
backup), so after a purge no byte of the home or of a backup made before it yields the text
or the key; folds and rebuilds go on; a missing or changed key is a typed error naming the
element; a backup restores onto a home whose keys remain, or with the keys file."""

from __future__ import annotations

import asyncio
import base64
import shutil
from pathlib import Path

import pytest

from pulse_core import (
    ElementTextUnreadable,
    EventDraft,
    Memory,
    MemoryBoard,
    Projector,
    identity_key,
    open_home,
    read_identity,
)
from pulse_core.maintenance import Authority, ElementsReader, MemoryElements, RetentionLadder
from pulse_core.memory import reveal_memory
from pulse_core.store import PURGED_TEXT, ElementKeys, open_event_store, parse_store_url, reveal
from tests.cli.runner import Upulse

TEST_TIME_LIMIT_S = 120  # up to six `upulse` processes a test (init, backup, restores)
MARK = "MARKER-7f3a9c-erase-me"
ELEMENTS = ("ana/x-said", "ana/diary", "ana/f-att")


async def _write(home: Path) -> dict[str, bytes]:
    """Element text (an exchange, a state value, a fact with an attachment) written with the
    marker, folded and checkpointed; the elements' keys."""
    stores = await open_home(home)
    try:
        board = MemoryBoard(stores.events)
        await board.register("ana", "Ana")
        await board.write("ana", "human-exchange",
                          {"record": "x-said", "text": f"{MARK} said", "role": "human"},
                          origin="human")
        await board.set_state("ana", "diary", {"entry": f"{MARK} state"})
        await stores.events.append([EventDraft(
            "temporal-fact-recorded", identity_key("ana"),
            {"record": "f-att", "text": f"{MARK} fact"}, attachment=f"{MARK} bytes".encode())])
        await board.exchange("ana", "nothing to purge here")
        projector = Projector(stores.events, [Memory(), MemoryElements()],
                              checkpoints=stores.layout.checkpoints)
        await projector.catch_up()
        await projector.checkpoint()
        assert stores.events.keys is not None
        keys = {e: stores.events.keys.key(e) for e in ELEMENTS}
        return {e: k for e, k in keys.items() if k is not None}
    finally:
        await stores.close()


async def _purge(home: Path) -> None:
    stores = await open_home(home)
    try:
        store = stores.events
        authority = Authority(store, standing={"maintenance": ("archive", "purge")})
        ladder = RetentionLadder(store, ElementsReader(store), authority, "maintenance",
                                 origin="executor:maintenance")
        for eid in ELEMENTS:
            await ladder.archive(eid)
            await ladder.purge(eid, confirm=eid)
    finally:
        await stores.close()


async def _backup_text(backup: Path, keys_db: Path) -> list[object]:
    """The exchange text and state value in the backup's log, opened with `keys_db`."""
    store = await open_event_store(parse_store_url(f"sqlite://{backup / 'events.db'}"),
                                   read_only=True)
    keys = ElementKeys(keys_db, read_only=True)
    try:
        found = await store.read(key=identity_key("ana"))
        return [reveal(e.data.get("text", e.data.get("value")), keys, purged=None)
                for e in found if e.kind in ("human-exchange", "state-set")]
    finally:
        keys.close()
        await store.close()


def _leaks(roots: list[Path], needles: list[bytes]) -> list[str]:
    return [f"{path}: {needle[:12]!r}" for root in roots for path in sorted(root.rglob("*"))
            if path.is_file() for needle in needles if needle in path.read_bytes()]


def test_a_purge_leaves_no_byte_of_the_text_or_its_key_in_the_home_or_an_earlier_backup(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    keys = asyncio.run(_write(home))
    assert set(keys) == set(ELEMENTS)
    needles = [MARK.encode(), *keys.values(),
               *(base64.b64encode(k) for k in keys.values())]
    plain = _leaks([home], [MARK.encode()])  # sealed at append: plain only in the text
    assert plain and all(  # index beside the keys (docs/memory.md, "Recall")
        Path(p.partition(": ")[0]).name.startswith("keys.db") for p in plain), plain
    assert _leaks([home], list(keys.values()))  # the keys are there (the grep can see)
    upulse("backup", tmp_path / "backup", "--home", home)
    assert not (tmp_path / "backup" / "keys.db").exists()
    before = asyncio.run(_backup_text(tmp_path / "backup", home / "keys.db"))
    assert before[:2] == [f"{MARK} said", {"entry": f"{MARK} state"}]

    asyncio.run(_purge(home))

    assert _leaks([home, tmp_path / "backup"], needles) == []
    with pytest.raises(ElementTextUnreadable, match="ana/x-said") as raised:
        asyncio.run(_backup_text(tmp_path / "backup", home / "keys.db"))
    assert raised.value.purged and raised.value.element == "ana/x-said"


async def _after_purge(home: Path) -> None:
    stores = await open_home(home)
    try:
        records = await read_identity(stores.events, "ana")
        assert records is not None
        assert [x.text for x in records.exchanges] == ["nothing to purge here"]
        assert {(r.record, r.how) for r in records.removed} >= {
            ("x-said", "purged"), ("diary", "purged"), ("f-att", "purged")}
        assert records.state == ()
        destroyed = await stores.events.read(kinds=["element-key-destroyed"])
        assert sorted(e.data["element"] for e in destroyed) == sorted(ELEMENTS)
        shutil.rmtree(stores.layout.checkpoints)  # rebuilt from the log, after the purge
        states = await Projector(stores.events, [Memory(), MemoryElements()]).catch_up()
        memory = states["memory"].get("ana")
        assert [x.text for x in reveal_memory(memory, stores.events.keys).exchanges] == [
            "nothing to purge here"]
        assert set(ELEMENTS) <= states["elements"].purged
    finally:
        await stores.close()


def test_after_a_purge_the_views_say_purged_and_a_rebuild_from_the_log_still_works(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    asyncio.run(_write(home))
    asyncio.run(_purge(home))
    asyncio.run(_after_purge(home))


async def _read_all(home: Path) -> list[str]:
    stores = await open_home(home)
    try:
        records = await read_identity(stores.events, "ana")
        assert records is not None
        await Projector(stores.events, [Memory(), MemoryElements()]).catch_up()  # never raises
        return [x.text for x in records.exchanges]
    finally:
        await stores.close()


def test_a_missing_or_changed_key_is_a_typed_error_naming_the_element(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    keys = asyncio.run(_write(home))
    assert asyncio.run(_read_all(home)) == ["nothing to purge here", f"{MARK} said"]
    saved = tmp_path / "keys.db"
    shutil.copyfile(home / "keys.db", saved)
    for name in ("keys.db", "keys.db-wal", "keys.db-shm"):
        (home / name).unlink(missing_ok=True)
    with pytest.raises(ElementTextUnreadable, match="no key for element 'ana/x-") as raised:
        asyncio.run(_read_all(home))
    assert raised.value.element.startswith("ana/x-") and not raised.value.purged
    for name in ("keys.db-wal", "keys.db-shm"):
        (home / name).unlink(missing_ok=True)
    flipped = saved.read_bytes()
    key = keys["ana/x-said"]
    at = flipped.index(key)
    (home / "keys.db").write_bytes(flipped[:at] + bytes([key[0] ^ 1]) + flipped[at + 1:])
    with pytest.raises(ElementTextUnreadable, match="'ana/x-said' does not open"):
        asyncio.run(_read_all(home))


def test_a_backup_restores_onto_a_home_whose_keys_remain_or_with_the_keys_file(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    asyncio.run(_write(home))
    keys_file = tmp_path / "apart" / "keys.json"
    keys_file.parent.mkdir()
    refused = upulse("backup", tmp_path / "backup", "--home", home, "--keys",
                     tmp_path / "backup" / "keys.json", ok=False)
    assert refused.returncode != 0 and "outside DEST" in refused.stderr
    upulse("backup", tmp_path / "backup", "--home", home, "--keys", keys_file)
    assert keys_file.stat().st_mode & 0o777 == 0o600
    upulse("restore", tmp_path / "backup", "--home", home, "--force")
    assert asyncio.run(_read_all(home))[-1] == f"{MARK} said"
    other = tmp_path / "elsewhere"
    upulse("restore", tmp_path / "backup", "--home", other, "--keys", keys_file)
    assert asyncio.run(_read_all(other))[-1] == f"{MARK} said"
    bare = tmp_path / "bare"
    upulse("restore", tmp_path / "backup", "--home", bare)
    with pytest.raises(ElementTextUnreadable, match=r"keys\.db is missing"):
        asyncio.run(_read_all(bare))


async def _legacy(home: Path) -> None:
    from pulse_core import SqliteEventStore

    plain = await SqliteEventStore.open(home / "events.db")  # a store of before sealing
    await MemoryBoard(plain).exchange("ana", "written before sealing")
    await plain.close()
    stores = await open_home(home)
    try:
        await MemoryBoard(stores.events).exchange("ana", "written after")
        records = await read_identity(stores.events, "ana")
        assert records is not None
        assert [x.text for x in records.exchanges] == ["written after", "written before sealing"]
        raw = [e.data["text"] for e in await stores.events.read(kinds=["human-exchange"])]
        assert raw[0] == "written before sealing" and raw[1] != "written after"
        assert reveal(raw[1], stores.events.keys) == "written after"
        assert reveal("plain", None) == "plain" and PURGED_TEXT == "[purged]"
    finally:
        await stores.close()


def test_elements_written_before_sealing_stay_readable_beside_sealed_ones(
        tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    asyncio.run(_legacy(tmp_path / "home"))
