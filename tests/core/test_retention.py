"""The retention ladder: archive, tombstone, purge, payload purge, legal hold, correction, stale."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import pulse_core.maintenance._beliefs  # noqa: F401  (registers assertion-made)
from pulse_core._errors import InvalidTransition, NotAuthorized, PurgeRefused
from pulse_core._events import EventDraft
from pulse_core._projector import Projector
from pulse_core.maintenance import ElementsReader
from pulse_core.maintenance._activities import read_activity
from pulse_core.maintenance._authority import Authority
from pulse_core.maintenance._element_kinds import InsightRecorded
from pulse_core.maintenance._retention import RetentionLadder
from pulse_core.memory import Memory, MemoryBoard, identity_key
from pulse_core.store import ObjectStore, SqliteEventStore
from pulse_core.store._base import EventStore

ALL = ("archive", "retention", "purge", "maintain")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EventStore]:
    opened = await SqliteEventStore.open(tmp_path / "events.db",
                                         objects=ObjectStore(tmp_path / "objects"))
    yield opened
    await opened.close()


def ladder(store: EventStore, grants: tuple[str, ...] = ALL,
           origin: str = "executor:maintenance") -> RetentionLadder:
    authority = Authority(store, standing={"maintenance": grants})
    return RetentionLadder(store, ElementsReader(store), authority, "maintenance",
                           origin=origin)


async def snapshot(store: EventStore) -> tuple[bytes, Any, Any]:
    """The whole log, byte for byte, and the current forms folded from it."""
    log = msgspec.json.encode(await store.read())
    memory = (await Projector(store, [Memory()]).catch_up())["memory"]
    elements = await ElementsReader(store).current()
    return log, dict(memory.items()), dict(elements.elements.items())


async def test_archive_and_tombstone_keep_the_record_and_restore_brings_it_back(
    store: EventStore,
) -> None:
    await MemoryBoard(store).set_state("ana", "city", "Lisbon", confidence=0.7)
    lad = ladder(store)
    event = await lad.archive("ana/city", "old")
    activity = await read_activity(store, event.data["activity"])
    assert activity is not None and activity.activity_class == "archive"
    assert activity.inputs == ("ana/city",) and activity.actors == ("maintenance",)
    await lad.restore("ana/city")
    await lad.archive("ana/city")
    await lad.tombstone("ana/city")
    memory = (await Projector(store, [Memory()]).catch_up())["memory"]["ana"]
    assert memory.state["city"].value == "Lisbon" and memory.state["city"].confidence == 0.7
    assert (await lad.reader.current()).elements["ana/city"].stage == "tombstoned"
    with pytest.raises(InvalidTransition, match="only archived"):
        await lad.restore("ana/city")


async def test_tombstone_needs_an_archived_element_and_every_step_its_grant(
    store: EventStore,
) -> None:
    await MemoryBoard(store).set_state("ana", "city", "Lisbon")
    with pytest.raises(InvalidTransition, match="it is active"):
        await ladder(store).tombstone("ana/city")
    with pytest.raises(NotAuthorized, match="'archive'"):
        await ladder(store, grants=("retention",)).archive("ana/city")
    with pytest.raises(InvalidTransition, match="does not exist"):
        await ladder(store).archive("ana/nope")


@pytest.mark.parametrize("case", ["no grant", "legal hold", "not confirmed", "active",
                                  "referenced"])
async def test_a_refused_purge_changes_nothing_at_all(store: EventStore, case: str) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon")
    lad = ladder(store)
    if case != "active":
        await lad.archive("ana/city")
    if case == "legal hold":
        await lad.set_hold("ana/city", "litigation")
    if case == "referenced":
        await store.append([EventDraft("insight-recorded", identity_key("ana"),
                                       msgspec.to_builtins(InsightRecorded(
                                           record="i-1", text="lives by the sea",
                                           derived_from=("city",), activity="a-1")),
                                       origin="executor:maintenance")])
    before = await snapshot(store)
    error: type[Exception] = NotAuthorized if case == "no grant" else PurgeRefused
    actor = ladder(store, grants=("archive", "retention")) if case == "no grant" else lad
    with pytest.raises(error):
        await actor.purge("ana/city", confirm="ana/other" if case == "not confirmed"
                          else "ana/city")
    assert await snapshot(store) == before


async def test_a_purge_removes_the_element_everywhere_with_its_bytes_and_an_audit(
    store: EventStore,
) -> None:
    assert store.objects is not None
    await store.append([EventDraft("observation-recorded", identity_key("ana"), {
        "record": "o-1", "source": "cam", "key": "photo"}, origin="watcher:cam",
        attachment=b"jpeg bytes")])
    lad = ladder(store)
    digest = (await lad.reader.current()).elements["ana/o-1"].digest
    assert digest is not None and store.objects.exists(digest)
    await lad.archive("ana/o-1")
    await lad.purge("ana/o-1", confirm="ana/o-1", reason="asked to delete")
    state = await lad.reader.current()
    assert "ana/o-1" not in state.elements and "ana/o-1" in state.purged
    memory = (await Projector(store, [Memory()]).catch_up())["memory"]["ana"]
    assert memory.observations == {} and "o-1" in memory.removed
    assert not store.objects.exists(digest)
    audit = await read_activity(store, "purge:ana/o-1")
    assert audit is not None and audit.activity_class == "purge"
    with pytest.raises(InvalidTransition, match="was purged"):
        await lad.purge("ana/o-1", confirm="ana/o-1")


async def test_a_payload_purge_keeps_the_event_its_digest_and_the_record(
    store: EventStore,
) -> None:
    assert store.objects is not None
    stored = (await store.append([EventDraft(
        "observation-recorded", identity_key("ana"),
        {"record": "o-1", "source": "mic", "key": "voice"}, origin="watcher:mic",
        attachment=b"audio")])).events[0]
    lad = ladder(store)
    with pytest.raises(PurgeRefused, match="not confirmed"):
        await lad.purge_payload("ana/o-1", confirm="yes")
    await lad.set_hold("ana/o-1")
    with pytest.raises(PurgeRefused, match="legal hold"):
        await lad.purge_payload("ana/o-1", confirm="ana/o-1")
    assert stored.hash is not None and store.objects.exists(stored.hash)
    await ladder(store, origin="human:ana").release_hold("ana/o-1")
    await lad.purge_payload("ana/o-1", confirm="ana/o-1", reason="digested")
    kept = (await store.read(key=identity_key("ana"), kinds=["observation-recorded"]))[0]
    assert kept == stored and kept.hash == stored.hash
    assert not store.objects.exists(stored.hash)
    element = (await lad.reader.current()).elements["ana/o-1"]
    assert element.payload_purged and element.digest == stored.hash
    assert element.stage == "active"
    memory = (await Projector(store, [Memory()]).catch_up())["memory"]["ana"]
    assert "o-1" in memory.observations


async def test_only_a_human_origin_releases_a_legal_hold(store: EventStore) -> None:
    await MemoryBoard(store).set_state("ana", "city", "Lisbon")
    lad = ladder(store)
    await lad.set_hold("ana/city")
    with pytest.raises(NotAuthorized, match="only a human"):
        await lad.release_hold("ana/city")
    assert (await lad.reader.current()).elements["ana/city"].legal_hold


async def test_a_correction_links_both_records_and_flags_what_derived_from_the_old_one(
    store: EventStore,
) -> None:
    board = MemoryBoard(store)
    old = (await board.observe("ana", "scale", "kg", 80)).data["record"]
    new = (await board.observe("ana", "scale", "kg", 70)).data["record"]
    await store.append([EventDraft("insight-recorded", identity_key("ana"),
                                   msgspec.to_builtins(InsightRecorded(
                                       record="i-1", text="heavier", derived_from=(old,),
                                       activity="a-1")), origin="executor:maintenance")])
    lad = ladder(store)
    flagged = await lad.correct("ana", old, new, "scale was miscalibrated")
    assert flagged == ["ana/i-1"]
    state = await lad.reader.current()
    assert state.elements[f"ana/{old}"].corrected_by == f"ana/{new}"
    assert state.elements[f"ana/{new}"].corrects == f"ana/{old}"
    assert state.elements["ana/i-1"].stale and state.elements["ana/i-1"].stage == "active"
    memory = (await Projector(store, [Memory()]).catch_up())["memory"]["ana"]
    assert {old, new, } <= set(memory.observations)
    with pytest.raises(InvalidTransition, match="already corrected"):
        await lad.correct("ana", old, new)


async def test_mark_stale_walks_dependents_depth_bounded_and_only_once(
    store: EventStore,
) -> None:
    await MemoryBoard(store).set_state("ana", "city", "Lisbon")
    for record, source in (("i-1", "city"), ("i-2", "i-1"), ("i-3", "i-2")):
        await store.append([EventDraft("insight-recorded", identity_key("ana"),
                                       msgspec.to_builtins(InsightRecorded(
                                           record=record, text=record,
                                           derived_from=(source,), activity="a")),
                                       origin="executor:maintenance")])
    lad = ladder(store)
    assert await lad.mark_stale("ana/city", depth=2) == ["ana/i-1", "ana/i-2"]
    last = await store.last_seq()
    assert await lad.mark_stale("ana/city", depth=2) == []
    assert await store.last_seq() == last
    state = await lad.reader.current()
    assert not state.elements["ana/i-3"].stale
    await lad.clear_stale("ana/i-1", "still holds")
    assert not (await lad.reader.current()).elements["ana/i-1"].stale
    with pytest.raises(InvalidTransition, match="not flagged"):
        await lad.clear_stale("ana/i-1")
    assert await lad.mark_stale("ana/city", depth=1) == ["ana/i-1"]  # a new revision: again
    with pytest.raises(NotAuthorized):
        await ladder(store, grants=("archive",)).mark_stale("ana/city")


async def test_a_ladder_step_rereads_and_retries_once_on_a_version_conflict(
    store: EventStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    board = MemoryBoard(store)
    await board.set_state("ana", "city", "Lisbon")
    lad = ladder(store)
    real = store.append
    raced: list[int] = []

    async def racing(drafts: Any, expect: Any = None) -> Any:
        if drafts and drafts[0].kind == "element-archived" and not raced:
            raced.append((await real([EventDraft("state-revised", identity_key("ana"), {
                "record": "city", "value": "Porto", "value_changed": True},
                origin="human")])).events[0].seq)
        return await real(drafts, expect=expect)

    monkeypatch.setattr(store, "append", racing)
    event = await lad.archive("ana/city")
    assert raced and event.seq > raced[0]
    assert len(await store.read(kinds=["element-archived"])) == 1


# -- review findings: shared bytes, references, authority mid-way, crash-safe purge -------


async def observe(store: EventStore, record: str, attachment: bytes | None = None,
                  key: str = "identity:ana") -> Any:
    draft = EventDraft("observation-recorded", key, {"record": record, "source": "scan",
                                                    "key": record}, origin="agent",
                       attachment=attachment)
    return (await store.append([draft])).events[0]


async def test_a_payload_purge_refuses_bytes_that_a_held_element_shares(
    store: EventStore,
) -> None:
    assert store.objects is not None
    a = await observe(store, "o-a", b"the same scanned contract")
    await observe(store, "o-b", b"the same scanned contract")
    lad = ladder(store)
    await lad.set_hold("ana/o-b", "litigation")
    with pytest.raises(PurgeRefused, match="ana/o-b"):
        await lad.purge_payload("ana/o-a", confirm="ana/o-a")
    assert store.objects.exists(a.hash)
    state = await lad.reader.current()
    assert not state.elements["ana/o-b"].payload_purged


async def test_no_purge_deletes_bytes_another_live_element_or_event_still_names(
    store: EventStore,
) -> None:
    assert store.objects is not None
    shared = await observe(store, "o-a", b"invoice")
    await observe(store, "o-b", b"invoice")
    note = await observe(store, "o-c", b"memo", key="identity:bob")
    await observe(store, "o-d", b"memo")
    lad = ladder(store)
    with pytest.raises(PurgeRefused, match="ana/o-b"):
        await lad.purge_payload("ana/o-a", confirm="ana/o-a")
    await lad.archive("ana/o-a")
    await lad.purge("ana/o-a", confirm="ana/o-a")  # the element goes, the bytes stay
    assert store.objects.exists(shared.hash)
    await lad.archive("ana/o-d")
    await lad.purge("ana/o-d", confirm="ana/o-d")
    assert store.objects.exists(note.hash)  # bob/o-c still names them
    await lad.archive("ana/o-b")
    await lad.purge("ana/o-b", confirm="ana/o-b")  # the last one: now the bytes go
    assert not store.objects.exists(shared.hash)


async def test_bytes_a_non_memory_event_names_survive_an_element_purge(
    store: EventStore,
) -> None:
    assert store.objects is not None
    from pulse_core._events import register_kind
    register_kind("review-note", "a note with an attachment (test)")
    await observe(store, "o-pdf", b"invoice.pdf")
    note = (await store.append([EventDraft("review-note", "notes:1", {"n": 1},
                                           origin="agent", attachment=b"invoice.pdf")]
                               )).events[0]
    lad = ladder(store)
    await lad.archive("ana/o-pdf")
    await lad.purge("ana/o-pdf", confirm="ana/o-pdf")
    assert note.hash is not None and store.objects.exists(note.hash)
    await observe(store, "o-2", b"invoice.pdf")
    with pytest.raises(PurgeRefused, match="event on notes:1"):
        await lad.purge_payload("ana/o-2", confirm="ana/o-2")


async def test_a_correction_is_not_purged_while_the_record_it_corrects_lives(
    store: EventStore,
) -> None:
    await observe(store, "o-old")
    await observe(store, "o-new")
    lad = ladder(store)
    await lad.correct("ana", "o-old", "o-new", "typo")
    await lad.archive("ana/o-new")
    with pytest.raises(PurgeRefused, match="ana/o-old"):
        await lad.purge("ana/o-new", confirm="ana/o-new")


async def test_evidence_cited_before_it_was_written_cannot_be_purged(
    store: EventStore,
) -> None:
    await store.append([
        EventDraft("assertion-made", "identity:ana", {"record": "a-1", "slot": "city",
                   "value": "Porto", "evidence": ["ana/o-1"]}, origin="agent"),
        EventDraft("observation-recorded", "identity:ana", {"record": "o-1", "source": "gps",
                   "key": "city", "value": "Porto"}, origin="agent")])
    lad = ladder(store)
    await lad.archive("ana/o-1")
    with pytest.raises(PurgeRefused, match="ana/a-1"):
        await lad.purge("ana/o-1", confirm="ana/o-1")


class RevokingAuthority(Authority):
    """Revokes the grant right after the first check read it: a revocation racing a write."""

    raced = False

    async def check(self, principal: str, permission: str, action: str) -> int:
        version = await super().check(principal, permission, action)
        if not self.raced:
            self.raced = True
            await self.revoke(principal, permission, origin="human:ops")
        return version


@pytest.mark.parametrize("action", ["archive", "purge", "purge_payload", "set_hold"])
async def test_a_grant_revoked_between_the_check_and_the_write_stops_the_write(
    store: EventStore, action: str,
) -> None:
    stored = await observe(store, "o-1", b"bytes")
    permission = {"archive": "archive", "purge": "purge", "purge_payload": "purge",
                  "set_hold": "retention"}[action]
    if action == "purge":
        await ladder(store).archive("ana/o-1")
    authority = RevokingAuthority(store)
    await authority.issue("maintenance", permission, origin="human:ops")
    lad = RetentionLadder(store, ElementsReader(store), authority, "maintenance",
                          origin="executor:maintenance")
    before = await store.last_seq()
    with pytest.raises(NotAuthorized):
        if action in ("purge", "purge_payload"):
            await getattr(lad, action)("ana/o-1", confirm="ana/o-1")
        else:
            await getattr(lad, action)("ana/o-1")
    written = await store.read(after_seq=before)
    assert [e.kind for e in written] == ["grant-revoked"]
    assert store.objects is not None and store.objects.exists(stored.hash)


async def test_an_element_purge_records_its_byte_deletion_in_the_same_append_and_finishes_it(
    store: EventStore,
) -> None:
    assert store.objects is not None
    stored = await observe(store, "o-1", b"photo")
    lad = ladder(store)
    await lad.archive("ana/o-1")
    objects = store.objects
    real = objects.delete_sync

    def crash(digest: str) -> bool:
        raise OSError("crashed before the bytes went")
    objects.delete_sync = crash  # type: ignore[method-assign]
    with pytest.raises(OSError):
        await lad.purge("ana/o-1", confirm="ana/o-1")
    objects.delete_sync = real  # type: ignore[method-assign]
    purged = [e for e in await store.read() if e.kind in ("element-purged", "payload-purged")]
    assert {e.kind for e in purged} == {"element-purged", "payload-purged"}
    assert purged[0].seq + 1 == purged[1].seq  # one append: the decision is never lost
    assert objects.exists(stored.hash)
    assert await lad.finish_purges() == [stored.hash]
    assert not objects.exists(stored.hash)
    assert await lad.finish_purges() == []
