"""Seed 004's WorkingState refresh (cycle step 12) on a real store, and the session primer
read from it: the digest names what is open, stamps its basis, is written again only when it
changed, stays within its bounds, and the primer is cut to size."""

from __future__ import annotations

import pytest

from pulse_adapters.maintenance import (
    WORKING_STATE,
    WorkingState,
    render_working_state,
    run_cycle,
    session_primer,
)
from pulse_core import EventDraft, ManualClock
from pulse_core.maintenance import WatchArmed, WatchCondition, arm_watch
from pulse_core.memory import identity_key
from tests.maintenance.conftest import OpenStore

HOUR = 3_600_000


def commitment(record: str, text: str, due_at: int | None) -> EventDraft:
    return EventDraft("commitment-made", identity_key("ana"),
                      {"record": record, "text": text, "due_at": due_at}, origin="agent")


async def test_the_digest_names_open_commitments_and_armed_watches_with_its_basis(
        open_store: OpenStore) -> None:
    clock = ManualClock()
    store = await open_store(clock)
    try:
        assert await session_primer(store) is None  # no cycle yet
        report = await run_cycle(store, clock=clock, cycle="c0")
        assert "working_state_refreshed" not in report.changes  # nothing open, ever
        await store.append([EventDraft("identity-registered", identity_key("ana"),
                                       {"name": "Ana"}, origin="agent"),
                            commitment("c-late", "call Ana back", clock.now_ms() - HOUR),
                            commitment("c-soon", "send the report", clock.now_ms() + HOUR)])
        await arm_watch(store, "w-deploy", WatchArmed(
            watch_class="delta", condition=WatchCondition(kinds=("log-line",)),
            reason="the deploy log shows an error"), origin="agent")
        report = await run_cycle(store, clock=clock, cycle="c1")
        assert report.changes["working_state_refreshed"] == 1
        events = await store.read(kinds=[WORKING_STATE])
        assert len(events) == 1
        body = events[0].payload(WorkingState)
        assert body.cycle == "c1" and body.basis_seq < events[0].seq
        assert [c.id for c in body.commitments] == ["ana/c-late", "ana/c-soon"]  # soonest
        assert [c.overdue for c in body.commitments] == [True, False]
        assert body.watches == ("w-deploy: the deploy log shows an error",)
        summary = render_working_state(body, store.keys)
        assert "- call Ana back (due " in summary and "pending, overdue)" in summary
        assert "- send the report (due " in summary and "pending)" in summary
        assert "Armed watches (1):\n- w-deploy: the deploy log shows an error" in summary

        again = await run_cycle(store, clock=clock, cycle="c2")
        assert "working_state_refreshed" not in again.changes  # unchanged: not rewritten
        assert len(await store.read(kinds=[WORKING_STATE])) == 1

        primer = await session_primer(store)
        assert primer is not None
        assert primer.startswith(f"Working state as of event #{body.basis_seq} (")
        assert "call Ana back" in primer
        short = await session_primer(store, max_chars=80)
        assert short is not None and len(short) == 80 and short.endswith(" ...")
        with pytest.raises(ValueError, match="below 80"):
            await session_primer(store, max_chars=79)
    finally:
        await store.close()


async def test_the_digest_lists_at_most_ten_of_each_and_says_how_many_more(
        open_store: OpenStore) -> None:
    clock = ManualClock()
    store = await open_store(clock)
    try:
        await store.append([EventDraft("identity-registered", identity_key("ana"),
                                       {"name": "Ana"}, origin="agent"),
                            *(commitment(f"c{i:02}", f"task {i:02} " + "x" * 300,
                                         clock.now_ms() + i * HOUR) for i in range(25))])
        await run_cycle(store, clock=clock, cycle="c1")
        body = (await store.read(kinds=[WORKING_STATE]))[0].payload(WorkingState)
        assert len(body.commitments) == 10 and body.open_commitments == 25
        summary = render_working_state(body, store.keys)
        assert len(summary) <= 2_000
        assert summary.startswith("Open commitments (25):\n- task 00")
    finally:
        await store.close()
