"""The store contract, through the Recorder interface. A backend's test module subclasses
RecorderContract and supplies `open_recorder`; every test here drives an EventStore over that
recorder (or the recorder itself, for copying a log in) and passes unchanged for every
backend: SQLite, PostgreSQL, and a third one registered through an entry point
(tests/core/test_store_plugin.py)."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pulse_core import (
    EventDraft,
    EventStore,
    IdempotencyConflict,
    InvalidEvent,
    ObjectStore,
    PayloadNotEncodable,
    StoreClosed,
    StoreError,
    UnknownKind,
    VersionConflict,
)
from pulse_core.store import Recorder, StoredRow


def draft(key: str = "k", n: int = 0, **kw: Any) -> EventDraft:
    return EventDraft(kw.pop("kind", "tick"), key, {"n": n}, origin=kw.pop("origin", "agent"), **kw)


class RecorderContract(abc.ABC):
    @abc.abstractmethod
    async def open_recorder(self, name: str = "events", *, read_only: bool = False) -> Recorder:
        """A recorder on fresh storage named `name`; opening the same name again (in this
        test) opens the same log, as another process would."""

    @pytest.fixture(autouse=True)
    def _objects_folder(self, tmp_path: Path) -> None:
        self.objects_folder = tmp_path / "contract-objects"

    async def open_store(self, name: str = "events", *, read_only: bool = False) -> EventStore:
        recorder = await self.open_recorder(name, read_only=read_only)
        return EventStore(recorder, objects=ObjectStore(self.objects_folder, read_only=read_only))

    @pytest.fixture
    async def store(self) -> AsyncIterator[EventStore]:
        store = await self.open_store()
        yield store
        await store.close()

    async def test_an_origin_prefix_filter_reads_only_origins_that_start_with_it(
            self, store: EventStore) -> None:
        origins = ["executor:mail", "engine", "executor:b", "agent", "human", "executor:x%_",
                   "watcher:exé", "executor:mail"]
        await store.append([draft("k", n, origin=o) for n, o in enumerate(origins)])
        got = await store.read(origin_prefix="executor:", newest_first=True, limit=3)
        assert [e.origin for e in got] == ["executor:mail", "executor:x%_", "executor:b"]
        every = await store.read(origin_prefix="executor:")
        assert [e.seq for e in every] == [1, 3, 6, 8]
        assert [e.seq for e in await store.read(origin_prefix="executor:x%")] == [6]  # literal
        assert [e.seq for e in await store.read(origin_prefix="watcher:exé")] == [7]
        assert await store.read(origin_prefix="executor:mail:") == []
        assert [e.seq for e in await store.read(origin_prefix="")] == list(range(1, 9))
        both = await store.read(2, kinds=["tick"], key="k", origin_prefix="executor:")
        assert [e.seq for e in both] == [3, 6, 8]

    async def test_seq_is_gap_free_and_versions_count_per_key(self, store: EventStore) -> None:
        await store.append([draft("a"), draft("b"), draft("a")])
        await store.append([draft("a")])
        events = await store.read()
        assert [e.seq for e in events] == [1, 2, 3, 4]
        assert [(e.key, e.version) for e in events] == [("a", 1), ("b", 1), ("a", 2), ("a", 3)]
        assert await store.head("a") == 3
        assert await store.head("missing") == 0
        assert await store.last_seq() == 4

    async def test_one_append_shares_one_tx_and_ts(self, store: EventStore) -> None:
        first = await store.append([draft("a"), draft("b")])
        second = await store.append([draft("c")])
        assert len({e.tx for e in first.events}) == 1
        assert first.tx != second.tx
        assert first.events[0].ts == first.events[1].ts

    async def test_expected_version_admits_matching_append(self, store: EventStore) -> None:
        await store.append([draft("task")], expect={"task": 0})
        result = await store.append([draft("task", 1)], expect={"task": 1})
        assert result.events[0].version == 2

    async def test_version_conflict_writes_nothing_of_the_append(self, store: EventStore) -> None:
        await store.append([draft("task")])
        with pytest.raises(VersionConflict) as info:
            await store.append([draft("other"), draft("task")], expect={"task": 0})
        assert (info.value.key, info.value.expected, info.value.actual) == ("task", 0, 1)
        assert "task" in str(info.value) and "re-read" in str(info.value)
        assert [e.key for e in await store.read()] == ["task"]
        assert await store.head("other") == 0

    async def test_racing_appends_with_one_expected_version_admit_exactly_one(
        self, store: EventStore
    ) -> None:
        outcomes = await asyncio.gather(
            *[store.append([draft("slot", i)], expect={"slot": 0}) for i in range(10)],
            return_exceptions=True,
        )
        assert sum(not isinstance(o, BaseException) for o in outcomes) == 1
        assert all(isinstance(o, VersionConflict) for o in outcomes if isinstance(o, BaseException))
        assert await store.head("slot") == 1

    async def test_idempotent_replay_returns_the_stored_event(self, store: EventStore) -> None:
        first = await store.append([draft("a", 1, idem="req-1")])
        again = await store.append([draft("a", 1, idem="req-1")])
        assert again.replayed and not first.replayed
        assert again.events == first.events
        assert await store.last_seq() == 1

    async def test_idempotent_replay_skips_the_version_check(self, store: EventStore) -> None:
        await store.append([draft("a", 1, idem="req-1")], expect={"a": 0})
        again = await store.append([draft("a", 1, idem="req-1")], expect={"a": 0})
        assert again.replayed

    async def test_only_a_fully_repeated_append_is_a_replay(self, store: EventStore) -> None:
        first = await store.append([draft("a", 1, idem="req-1")])
        mixed = await store.append([draft("a", 1, idem="req-1"), draft("b", 2, idem="req-2")])
        assert not mixed.replayed
        assert mixed.events[0] == first.events[0]
        assert (mixed.events[1].seq, mixed.events[1].key, mixed.events[1].idem) == (2, "b", "req-2")
        assert [e.idem for e in await store.read()] == ["req-1", "req-2"]
        again = await store.append([draft("a", 1, idem="req-1"), draft("b", 2, idem="req-2")])
        assert again.replayed and again.events == mixed.events

    async def test_idempotency_key_with_other_content_conflicts(self, store: EventStore) -> None:
        await store.append([draft("a", 1, idem="req-1")])
        with pytest.raises(IdempotencyConflict, match="req-1"):
            await store.append([draft("a", 2, idem="req-1")])
        assert await store.last_seq() == 1

    async def test_unknown_kind_is_refused_by_name(self, store: EventStore) -> None:
        with pytest.raises(UnknownKind, match="efect-acked"):
            await store.append([draft(kind="efect-acked")])
        assert await store.last_seq() == 0

    async def test_malformed_drafts_are_refused_and_nothing_stored(
        self, store: EventStore
    ) -> None:
        await store.append([draft("keep")])
        bad: list[Any] = [
            EventDraft("tick", "k", {"x": object()}),
            EventDraft("Tick", "k"),
            EventDraft("tick", ""),
            EventDraft("tick", "k", origin="somebody else"),
            EventDraft("task-created", "t", {"no_title": 1}),
        ]
        for item in bad:
            with pytest.raises(InvalidEvent):
                await store.append([draft("fine"), item])
        with pytest.raises(PayloadNotEncodable):
            await store.append([EventDraft("tick", "k", {1j: 2})])
        assert [e.key for e in await store.read()] == ["keep"]

    async def test_a_nul_character_in_key_origin_idem_or_expect_is_refused_on_every_backend(
        self, store: EventStore
    ) -> None:
        # SQLite could store it, PostgreSQL could not: a log must move between them.
        await store.append([draft("keep")])
        for item, expect in [(EventDraft("tick", "k\0", {}), None),
                             (EventDraft("tick", "k", {}, origin="rule:a\0b"), None),
                             (EventDraft("tick", "k", {}, idem="i\0"), None),
                             (draft("k"), {"k\0": 0})]:
            with pytest.raises(InvalidEvent, match="NUL character"):
                await store.append([draft("fine"), item], expect=expect)
        await store.append([EventDraft("tick", "k", {"text": "a\0b"})])  # data may hold it
        assert [e.key for e in await store.read()] == ["keep", "k"]
        assert (await store.read(key="k"))[0].data == {"text": "a\0b"}

    async def test_read_filters_by_kind_key_and_limit(self, store: EventStore) -> None:
        await store.append([draft("a"), draft("b", kind="error"), draft("a", kind="error")])
        assert [e.seq for e in await store.read(kinds=["error"])] == [2, 3]
        assert [e.seq for e in await store.read(key="a")] == [1, 3]
        assert [e.seq for e in await store.read(1, limit=1)] == [2]
        assert await store.read(kinds=[]) == []

    async def test_newest_first_reads_the_latest_events_back_to_front(
        self, store: EventStore
    ) -> None:
        await store.append([EventDraft("tick", "a", {"n": n}) for n in range(5)])
        await store.append([EventDraft("error", "a", {"n": 9}), EventDraft("tick", "b")])
        (latest,) = await store.read(kinds=["tick"], key="a", limit=1, newest_first=True)
        assert latest.data == {"n": 4}
        seqs = [e.seq for e in await store.read(2, newest_first=True)]
        assert seqs == [7, 6, 5, 4, 3]
        page = await store.read_page(kinds=["tick"], limit=2, newest_first=True)
        assert [e.key for e in page.events] == ["b", "a"] and page.last_seq == 7

    async def test_events_survive_reopening(self) -> None:
        store = await self.open_store("persist")
        await store.append([draft("a", 7)])
        await store.close()
        again = await self.open_store("persist")
        try:
            (event,) = await again.read()
            assert (event.key, event.data, event.version) == ("a", {"n": 7}, 1)
            assert (await again.append([draft("a")])).events[0].seq == 2
        finally:
            await again.close()

    async def test_changes_yields_history_then_new_commits(self, store: EventStore) -> None:
        await store.append([draft("a", 1)])
        seen: list[int] = []

        async def follow() -> None:
            async for event in store.changes(0, kinds=["tick"], poll_interval=60.0):
                seen.append(event.data["n"])
                if len(seen) == 3:
                    return

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.05)
        await store.append([draft("b", 2, kind="error")])
        await store.append([draft("c", 2), draft("d", 3)])
        await asyncio.wait_for(task, 30.0)  # woken by the commits, not the 60 s poll
        assert seen == [1, 2, 3]

    async def test_subscribers_are_woken_on_commit(self, store: EventStore) -> None:
        signal = store.subscribe()
        assert not signal.is_set()
        await store.append([draft()])
        assert signal.is_set()
        store.unsubscribe(signal)

    async def test_append_after_close_is_refused(self) -> None:
        store = await self.open_store("closed")
        await store.close()
        with pytest.raises(StoreClosed):
            await store.append([draft()])

    async def test_one_append_cannot_repeat_an_idempotency_key(self, store: EventStore) -> None:
        with pytest.raises(InvalidEvent, match="repeats idempotency key 'twice'"):
            await store.append([draft("a", idem="twice"), draft("b", idem="twice")])
        assert await store.last_seq() == 0


    async def test_read_page_reports_the_newest_seq_beside_filtered_events(
        self, store: EventStore
    ) -> None:
        await store.append([draft("a"), draft("b", kind="error"), draft("c")])
        page = await store.read_page(kinds=["error"])
        assert [e.seq for e in page.events] == [2] and page.last_seq == 3
        page = await store.read_page(3)
        assert page.events == [] and page.last_seq == 3
        page = await store.read_page(0, limit=2)
        assert [e.seq for e in page.events] == [1, 2] and page.last_seq == 3
        assert (await store.read_page(kinds=[])).last_seq == 3

    async def test_a_second_writer_on_the_same_log_is_seen_by_the_first(
        self, store: EventStore
    ) -> None:
        other = await self.open_store()  # as another process would
        try:
            await store.append([draft("k", 1)])
            await other.append([draft("k", 2), draft("j", 2)])
            mine = await store.append([draft("k", 3)], expect={"k": 2})
            assert (mine.events[0].seq, mine.events[0].version) == (4, 3)
            with pytest.raises(VersionConflict):
                await other.append([draft("k", 4)], expect={"k": 2})
            theirs = await other.append([draft("j", 4)], expect={"j": 1})
            assert (theirs.events[0].seq, theirs.events[0].version) == (5, 2)
            again = await store.append([draft("k", 5, idem="once")])
            assert (await other.append([draft("k", 5, idem="once")])).events == again.events
        finally:
            await other.close()
        assert [(e.key, e.version) for e in await store.read()] == [
            ("k", 1), ("k", 2), ("j", 1), ("k", 3), ("j", 2), ("k", 4)]

    async def test_a_blocking_read_of_the_newest_seq_is_none_or_sees_every_writer(
        self, store: EventStore
    ) -> None:
        other = await self.open_store()  # as another process would
        try:
            if await asyncio.to_thread(store.last_seq_blocking) is None:
                return  # this backend reads only asynchronously: last_seq is the one
            await store.append([draft("k", 1)])
            await other.append([draft("k", 2), draft("j", 2)])
            assert await asyncio.to_thread(store.last_seq_blocking) == 3
            assert await asyncio.to_thread(other.last_seq_blocking) == 3
        finally:
            await other.close()
        with pytest.raises(StoreClosed):
            await asyncio.to_thread(other.last_seq_blocking)

    async def test_one_group_of_appends_keeps_each_outcome_apart(self, store: EventStore) -> None:
        await store.append([draft("taken", idem="r1")])
        outcomes = await asyncio.gather(
            store.append([draft("x")], expect={"x": 5}),
            store.append([draft("taken", 9, idem="r1")]),
            store.append([draft("y")]),
            store.append([draft("taken", idem="r1")]),
            store.append([draft("y")], expect={"y": 0}),
            return_exceptions=True)
        assert isinstance(outcomes[0], VersionConflict)
        assert isinstance(outcomes[1], IdempotencyConflict)
        assert not isinstance(outcomes[2], BaseException) and not outcomes[2].replayed
        assert not isinstance(outcomes[3], BaseException) and outcomes[3].replayed
        assert isinstance(outcomes[4], VersionConflict)
        assert [(e.key, e.version) for e in await store.read()] == [("taken", 1), ("y", 1)]

    async def test_a_cancelled_append_is_stored_whole_or_not_at_all(
        self, store: EventStore
    ) -> None:
        appends = [asyncio.create_task(store.append([draft(f"c{i}"), draft(f"c{i}")]))
                   for i in range(20)]
        await asyncio.sleep(0)
        for task in appends[::2]:
            task.cancel()
        await asyncio.gather(*appends, return_exceptions=True)
        after = await store.append([draft("after")])
        events = await store.read()
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        by_key: dict[str, int] = {}
        for event in events:
            by_key[event.key] = by_key.get(event.key, 0) + 1
        assert all(n == 2 for key, n in by_key.items() if key != "after")
        assert after.events[0].seq == len(events)

    async def test_attachments_go_to_objects_once(self, store: EventStore) -> None:
        blob = b"payload" * 1000
        first = await store.append([EventDraft("tick", "a", {"n": 1}, attachment=blob)])
        second = await store.append([EventDraft("tick", "b", {"n": 2}, attachment=blob)])
        digest = first.events[0].hash
        assert digest is not None and digest == second.events[0].hash
        assert store.objects is not None and await store.objects.get(digest) == blob

    async def test_a_read_only_store_reads_and_refuses_every_write(self) -> None:
        writer = await self.open_store("shared")
        await writer.append([draft("a", 1)])
        reader = await self.open_store("shared", read_only=True)
        try:
            assert reader.read_only and not writer.read_only
            with pytest.raises(StoreError, match="read-only"):
                await reader.append([draft("b")])
            with pytest.raises(StoreError, match="read-only"):
                await reader.append([EventDraft("tick", "b", attachment=b"bytes")])
            await writer.append([draft("a", 2)])
            assert [e.data["n"] for e in await reader.read()] == [1, 2]
            assert await reader.head("a") == 2 and await reader.last_seq() == 2
            assert await asyncio.to_thread(reader.last_seq_blocking) in (None, 2)
        finally:
            await reader.close()
            await writer.close()
        assert not self.objects_folder.exists() or not any(self.objects_folder.rglob("*"))

    # -- copying a log (upulse migrate) ------------------------------------------------------

    async def test_copy_rows_stores_another_logs_rows_exactly_and_appends_continue_them(
        self,
    ) -> None:
        source = await self.open_store("source")
        try:
            await source.append([draft("a", 1), draft("b", 2, idem="once")])
            await source.append([EventDraft("tick", "a", {"t": "é\u2028"}, attachment=b"blob")])
            await source.append([EventDraft("error", "c", {"nested": [1, {"x": None}]})])
            rows = await source.recorder.rows(0, 100)
        finally:
            await source.close()
        target = await self.open_recorder("copy")
        try:
            assert await target.copy_rows(rows[:2]) == 2
            assert await target.copy_rows(iter(rows[2:])) == 2
            assert await target.rows(0, 100) == rows
            assert await target.head("a") == 2 and await target.head("c") == 1
            assert await target.last_seq() == 4
            store = EventStore(target)
            assert [e.seq for e in await store.read()] == [1, 2, 3, 4]
            again = await store.append([draft("b", 2, idem="once")])
            assert again.replayed and again.events[0].seq == 2  # the copied idem is known
            after = await store.append([draft("a")], expect={"a": 2})
            assert (after.events[0].seq, after.events[0].version) == (5, 3)
        finally:
            await target.close()

    async def test_copy_rows_refuses_rows_that_do_not_continue_the_log(self) -> None:
        target = await self.open_recorder("copy")
        row = StoredRow(1, "id-1", "tick", "a", 1, 0, "agent", None, "tx", None, b"{}", None)
        try:
            with pytest.raises(StoreError, match="start at seq 2 but this log ends at seq 0"):
                await target.copy_rows([msgspec.structs.replace(row, seq=2)])
            with pytest.raises(StoreError, match="jump to seq 3"):
                await target.copy_rows([row, msgspec.structs.replace(row, seq=3, id="id-3")])
            assert await target.last_seq() == 0
            store = EventStore(target)
            await store.append([draft("a")])
            with pytest.raises(StoreError, match="ends at seq 1"):
                await target.copy_rows([row])
            assert len(await target.rows(0, 10)) == 1
            # rows that continue the log are taken, and appends continue after them
            await target.copy_rows([msgspec.structs.replace(row, seq=2, version=2)])
            after = await store.append([draft("a")], expect={"a": 2})
            assert (after.events[0].seq, after.events[0].version) == (3, 3)
        finally:
            await target.close()

    async def test_a_copied_row_that_cannot_be_decoded_is_kept_and_listed_apart(self) -> None:
        target = await self.open_recorder("copy")
        good = StoredRow(1, "id-1", "tick", "a", 1, 5, "agent", None, "tx-1", None,
                         b'{"n":1}', None)
        bad = StoredRow(2, "id-2", "tick", "b", 1, 6, "agent", None, "tx-2", None,
                        b"\xff\xfe not json", None)
        try:
            await target.copy_rows([good, bad])
            page = await target.select(0)
            assert [e.seq for e in page.events] == [1] and page.last_seq == 2
            assert [(u.seq, u.key, u.tx) for u in page.unreadable] == [(2, "b", "tx-2")]
            assert await target.rows(0, 10) == [good, bad]  # byte for byte
        finally:
            await target.close()

    async def test_a_read_only_recorder_refuses_to_copy_rows_in(self) -> None:
        await (await self.open_store("shared")).close()  # the log exists
        reader = await self.open_recorder("shared", read_only=True)
        row = StoredRow(1, "id-1", "tick", "a", 1, 0, "agent", None, "tx", None, b"{}", None)
        try:
            with pytest.raises(StoreError, match="read-only"):
                await reader.copy_rows([row])
        finally:
            await reader.close()
