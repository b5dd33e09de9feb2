"""write_through_outage: a write tried again through a store outage, and taken as done when a
lost reply's write is found stored (stored_next) (the PostgreSQL cases run for real in
tests/faults/test_pg_lost_reply.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from pulse_core import (
    AppendOutcomeUnknown,
    EventDraft,
    LockLost,
    SqliteEventStore,
    StoreUnavailable,
    VersionConflict,
    stored_next,
    write_through_outage,
)


def outcomes(*steps: BaseException | None) -> Callable[[], Awaitable[None]]:
    """A write that raises each of `steps` in turn (None: succeeds), then succeeds."""
    queue: Iterator[BaseException | None] = iter(steps)

    async def write() -> None:
        step = next(queue, None)
        if step is not None:
            raise step

    return write


async def test_a_write_is_tried_again_until_the_store_answers(
        caplog: pytest.LogCaptureFixture) -> None:
    tries: list[int] = []
    fails = outcomes(StoreUnavailable("down"), StoreUnavailable("still down"))

    async def write() -> None:
        tries.append(1)
        await fails()

    with caplog.at_level(logging.WARNING, "pulse"):
        await write_through_outage(write, patience_s=30, what="the thing")
    assert len(tries) == 3
    warned = [r.getMessage() for r in caplog.records if "the thing" in r.getMessage()]
    assert len(warned) == 1 and "cannot take it yet (down)" in warned[0]


async def test_past_its_patience_the_last_error_is_raised() -> None:
    with pytest.raises(StoreUnavailable, match="down") as raised:
        await write_through_outage(outcomes(*[StoreUnavailable("down")] * 100),
                                   patience_s=0.3, what="the thing")
    assert not isinstance(raised.value, AppendOutcomeUnknown)


async def test_a_write_that_may_be_stored_is_never_reported_as_not_stored() -> None:
    steps = [AppendOutcomeUnknown("lost reply"), *[StoreUnavailable("refused")] * 100]
    with pytest.raises(AppendOutcomeUnknown, match="may or may not be stored"):
        await write_through_outage(outcomes(*steps), patience_s=0.3, what="the thing")


@pytest.mark.parametrize("before", [[], [AppendOutcomeUnknown("lost reply")]])
async def test_a_lost_lock_ends_the_tries_at_once(
        before: list[StoreUnavailable], caplog: pytest.LogCaptureFixture) -> None:
    """Raised as it is, or, after a try whose outcome was unknown, as AppendOutcomeUnknown:
    a write that may be stored is never reported as refused."""
    tries: list[int] = []
    fails = outcomes(*before, LockLost("lost while held"), StoreUnavailable("down"))

    async def write() -> None:
        tries.append(1)
        await fails()

    with caplog.at_level(logging.WARNING, "pulse"), pytest.raises(LockLost if not before
                                                                  else AppendOutcomeUnknown
                                                                  ) as raised:
        await write_through_outage(write, patience_s=30, what="the thing")
    assert len(tries) == len(before) + 1
    assert len([r for r in caplog.records if "the thing" in r.getMessage()]) == len(before)
    if before:
        assert isinstance(raised.value.__cause__, LockLost)
        assert "the thing may or may not be stored" in str(raised.value)


async def test_no_patience_raises_the_first_failure_at_once() -> None:
    with pytest.raises(StoreUnavailable, match="down"):
        async with asyncio.timeout(5):
            await write_through_outage(outcomes(StoreUnavailable("down")), patience_s=0,
                                       what="the thing")


@pytest.mark.parametrize("found", [True, False])
async def test_a_conflict_after_a_lost_reply_is_done_when_the_write_is_found(
        found: bool) -> None:
    asked: list[bool] = []

    async def written() -> bool:
        asked.append(found)
        return found

    write = outcomes(AppendOutcomeUnknown("lost reply"), VersionConflict("k", 1, 2))
    if found:
        await write_through_outage(write, patience_s=30, what="the thing", written=written)
    else:
        with pytest.raises(VersionConflict):
            await write_through_outage(write, patience_s=30, what="the thing",
                                       written=written)
    assert asked == [found]


async def test_a_conflict_without_a_lost_reply_is_not_looked_into() -> None:
    async def written() -> bool:
        raise AssertionError("a conflict with no lost reply before it is the write's own")

    write = outcomes(StoreUnavailable("down"), VersionConflict("k", 1, 2))
    with pytest.raises(VersionConflict):
        await write_through_outage(write, patience_s=30, what="the thing", written=written)


async def test_a_try_that_hangs_is_cut_off_at_the_patience_as_maybe_stored() -> None:
    first = True

    async def write() -> None:
        nonlocal first
        if first:
            first = False
            raise StoreUnavailable("down")
        await asyncio.Event().wait()  # a server that stopped answering

    with pytest.raises(AppendOutcomeUnknown, match="did not answer within 1 s"):
        async with asyncio.timeout(30):  # bounds a hang only
            await write_through_outage(write, patience_s=1, what="the thing")


async def test_stored_next_finds_only_the_very_write_right_after_the_version(
        tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        mine = EventDraft("tick", "k", {"n": 1}, origin="engine")
        await store.append([EventDraft("tick", "k", {"n": 0}, origin="engine")])
        assert not await stored_next(store, "k", 1, mine)  # nothing after version 1 yet
        await store.append([mine], expect={"k": 1})
        assert await stored_next(store, "k", 1, mine)
        assert not await stored_next(store, "k", 0, mine)  # version 1 is another write
        assert not await stored_next(store, "k", 1, EventDraft("tick", "k", {"n": 2},
                                                               origin="engine"))
        assert not await stored_next(store, "k", 1, EventDraft("tick", "k", {"n": 1},
                                                               origin="cli"))
    finally:
        await store.close()
