"""The reviewer's two daily call budgets, reached exactly: with N calls allowed, a review is
still asked after N - 1 calls and refused after N (one identity's, and every identity's)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from pulse_adapters.awareness import AwarenessConfig
from pulse_adapters.awareness.effects import AwarenessReview
from pulse_adapters.awareness.ledger import DAY_MS, AwarenessLedger, CycleRecord
from pulse_adapters.awareness.rule import AwarenessRule
from pulse_core import (
    Decision,
    EventDraft,
    ManualClock,
    Memory,
    Snapshot,
    SqliteEventStore,
    identity_key,
)
from pulse_core._projector import Projector

BUDGET = 3
MORNING = 20_000 * DAY_MS + 3_600_000  # 01:00 UTC: the day does not turn during a test


async def nothing_inside(prev: Snapshot, curr: Snapshot) -> Decision:
    return Decision([], 60_000)


async def rule_after(tmp_path: Path, config: AwarenessConfig, calls: dict[str, int]
                     ) -> list[str]:
    """The identities the rule asks a review of, once "ana" said something new today, after
    `calls` model calls were made today for each identity (one reviewed cycle each)."""
    clock = ManualClock(MORNING)
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    for identity, made in calls.items():
        for i in range(made):
            await store.append([EventDraft("human-exchange", identity_key(identity),
                                           {"record": f"x-{i}", "text": f"hi {i}"},
                                           origin="human")])
            clock.advance(60_000)
            record = CycleRecord(identity=identity, outcome="reviewed", model_calls=1,
                                 source=f"x-{i}", fingerprint=f"world-{i}")
            await store.append([EventDraft("awareness-cycle", identity_key(identity),
                                           msgspec.to_builtins(record),
                                           origin="executor:awareness")])
    await store.append([EventDraft("human-exchange", identity_key("ana"),
                                   {"record": "x-news", "text": "news"}, origin="human")])
    clock.advance(int(config.initial_delay_s * 1000) + 1_000)
    states = await Projector(store, [Memory(), AwarenessLedger(config)]).catch_up()
    seq = await store.last_seq()
    await store.close()
    prev = Snapshot(seq=seq, at=clock.now_ms() - 1_000, number=1, vitals={}, projections=states)
    curr = Snapshot(seq=seq, at=clock.now_ms(), number=2, vitals={}, projections=states)
    decision = await AwarenessRule(config)(prev, curr, nothing_inside)
    return [e.identity for e in decision.effects if isinstance(e, AwarenessReview)]


@pytest.mark.parametrize(("made", "asked"), [(BUDGET - 1, ["ana"]), (BUDGET, [])])
async def test_one_identitys_daily_call_budget_allows_exactly_its_calls(
    tmp_path: Path, made: int, asked: list[str],
) -> None:
    config = AwarenessConfig(calls_per_identity_per_day=BUDGET)
    assert await rule_after(tmp_path, config, {"ana": made}) == asked


@pytest.mark.parametrize(("made", "asked"), [(BUDGET - 1, ["ana"]), (BUDGET, [])])
async def test_the_daily_call_budget_over_every_identity_allows_exactly_its_calls(
    tmp_path: Path, made: int, asked: list[str],
) -> None:
    config = AwarenessConfig(calls_per_day=BUDGET)
    others = {f"p{i}": 1 for i in range(made)}  # today's calls were others' reviews
    assert await rule_after(tmp_path, config, others) == asked
