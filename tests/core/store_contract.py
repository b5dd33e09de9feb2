"""The EventStore contract. A backend's test module subclasses EventStoreContract and supplies
`open_store`; every test here must pass unchanged for SQLite today and PostgreSQL tomorrow."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pulse_core import (
    EventDraft,
    EventStore,
    IdempotencyConflict,
    InvalidEvent,
    PayloadNotEncodable,
    StoreClosed,
    UnknownKind,
    VersionConflict,
)


def draft(key: str = "k", n: int = 0, **kw: Any) -> EventDraft:
    return EventDraft(kw.pop("kind", "tick"), key, {"n": n}, origin=kw.pop("origin", "agent"), **kw)


class EventStoreContract(abc.ABC):
    @abc.abstractmethod
    async def open_store(self, name: str = "events") -> EventStore:
        """A store on fresh storage named `name`; opening the same name again reopens it."""

    @pytest.fixture
    async def store(self) -> AsyncIterator[EventStore]:
        store = await self.open_store()
        yield store
        await store.close()

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

    async def test_read_filters_by_kind_key_and_limit(self, store: EventStore) -> None:
        await store.append([draft("a"), draft("b", kind="error"), draft("a", kind="error")])
        assert [e.seq for e in await store.read(kinds=["error"])] == [2, 3]
        assert [e.seq for e in await store.read(key="a")] == [1, 3]
        assert [e.seq for e in await store.read(1, limit=1)] == [2]
        assert await store.read(kinds=[]) == []

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
            async for event in store.changes(0, kinds=["tick"], poll_interval=5.0):
                seen.append(event.data["n"])
                if len(seen) == 3:
                    return

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.05)
        await store.append([draft("b", 2, kind="error")])
        await store.append([draft("c", 2), draft("d", 3)])
        await asyncio.wait_for(task, 2.0)
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
