"""Engines of several hosts sharing one log: an effect a tick decides runs on its own host
(unless its class allows any host), and each host's survival folds only its own history."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pulse_core import (
    Decision,
    Effect,
    Engine,
    Event,
    EventDraft,
    ExecutionContext,
    Executor,
    Inner,
    Snapshot,
    error_draft,
    fold_effect,
    host_of,
)
from pulse_core._effect_index import EffectIndex
from pulse_core._effects import effect_draft, mark_draft
from pulse_survival.effects import RestartProcess
from pulse_survival.ledger import SurvivalLedger
from pulse_survival.marks import StreakCounted


class Chore(Effect, tag="placement-chore"):
    n: int


class Review(Effect, tag="placement-review"):
    any_host: ClassVar[bool] = True
    n: int


def stored(draft: EventDraft, seq: int) -> Event:
    return Event(seq, f"id-{seq}", draft.kind, draft.key, 1, 1_000 + seq, draft.origin,
                 draft.cause, "tx", draft.idem, draft.data, None)


def test_an_effect_decided_on_a_host_is_bound_to_it_unless_its_class_allows_any_host() -> None:
    bound = stored(effect_draft(Chore(n=1), "engine:tick", host="h1"), 1)
    free = stored(effect_draft(Review(n=1), "engine:tick", host="h1"), 2)
    alone = stored(effect_draft(Chore(n=1), "engine:tick"), 3)
    assert host_of(bound) == "h1"
    assert host_of(free) == "" and host_of(alone) == ""
    entry = fold_effect(None, bound)
    assert entry is not None and entry.host == "h1"


def test_dedup_keys_hold_back_only_effects_that_may_run_on_this_host(tmp_path: Path) -> None:
    index = EffectIndex(None, tmp_path)  # type: ignore[arg-type]  # folds no store here
    for seq, (effect, host) in enumerate([(Chore(n=1), "h1"), (Chore(n=2), "h2"),
                                          (Review(n=3), "h2")], start=1):
        entry = fold_effect(None, stored(effect_draft(effect, "engine:tick", host=host), seq))
        assert entry is not None
        index.entries[entry.id] = entry
    keys = {e.data["effect"]["n"]: e.dedup for e in index.entries.values()}
    assert index.dedup_keys("h1") == {keys[1], keys[3]}
    assert index.dedup_keys("h2") == {keys[2], keys[3]}
    assert index.dedup_keys() == set(keys.values())


def test_a_hosts_survival_ledger_ignores_restarts_and_marks_another_host_recorded() -> None:
    restart = RestartProcess(name="agent", argv=("agent",))
    events = [
        stored(effect_draft(restart, "engine:tick", host="h1"), 1),
        stored(effect_draft(restart, "engine:tick", host="h2"), 2),
        stored(mark_draft(StreakCounted(rule="resource_guard", count=4), "engine:tick",
                          host="h2"), 3),
        stored(mark_draft(StreakCounted(rule="resource_guard", count=1), "engine:tick",
                          host="h1"), 4),
    ]
    for host, restarts, streak in (("h1", 1, 1), ("h2", 1, 4), ("", 2, 1)):
        ledger = SurvivalLedger(host)
        state = ledger.initial()
        for event in events:
            state = ledger.apply(state, event)
        assert len(state.process("agent").restarts) == restarts, host
        assert state.streaks["resource_guard"] == streak, host


class Sweep(Effect, tag="placement-sweep"):
    """What a host's rule decides about its own machine."""


class Sweeps(Executor):
    handles = (Sweep,)

    def __init__(self) -> None:
        self.runs = 0

    async def execute(self, effect: Sweep, ctx: ExecutionContext) -> None:
        self.runs += 1


async def sweep_once(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    decision = await inner(prev, curr)
    if curr.number == 1:
        return Decision([*decision.effects, Sweep()], decision.tick_ms)
    return decision


async def test_an_engine_on_a_shared_log_binds_its_decisions_to_its_host_and_others_leave_them(
        tmp_path: Path, pg_url: str) -> None:
    mine, theirs = Sweeps(), Sweeps()
    a = Engine(tmp_path / "a", store=pg_url, host="host-a", rules=[sweep_once],
               executors=[mine])
    b = Engine(tmp_path / "b", store=pg_url, host="host-b", executors=[theirs])
    await a.open()
    await b.open()  # opened, not started: only the calls below claim
    try:
        await a.step()
        [effect] = await a.events.read(kinds=["effect"])
        assert host_of(effect) == "host-a"
        await b.executor_loop.run_until_idle()  # b sees it first, and must leave it
        assert theirs.runs == 0
        await a.executor_loop.run_until_idle()
        assert mine.runs == 1
    finally:
        await b.close()
        await a.close()


async def test_an_engine_on_a_log_of_its_own_binds_nothing(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "a", host="host-a", rules=[sweep_once], executors=[Sweeps()])
    await engine.open()
    try:
        await engine.step()
        [effect] = await engine.events.read(kinds=["effect"])
        assert host_of(effect) == ""
    finally:
        await engine.close()


def test_errors_count_against_a_promotion_only_on_the_host_they_name() -> None:
    promote = EventDraft("promote", "engine-directory@h2", {"revision": "r2", "host": "h2"},
                         origin="cli")
    errors = [error_draft("rule:inbox", RuntimeError("boom"), host="h1"),
              error_draft("rule:inbox", RuntimeError("boom"), host="h2"),
              error_draft("awareness:quiet-hold", RuntimeError("redis down"))]
    for host, counted in (("h2", 1), ("h1", 0), ("", 3)):
        ledger = SurvivalLedger(host)
        state = ledger.initial()
        for seq, draft in enumerate([promote, *errors], start=1):
            state = ledger.apply(state, stored(draft, seq))
        assert len(state.errors_since_promote) == counted, host


async def test_an_engine_on_a_shared_log_names_its_host_in_its_rule_errors(
        tmp_path: Path, pg_url: str) -> None:
    async def broken(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        raise RuntimeError("broken business rule")

    engine = Engine(tmp_path / "a", store=pg_url, host="host-a", rules=[broken])
    await engine.open()
    try:
        await engine.step()
        errors = await engine.events.read(kinds=["error"])
    finally:
        await engine.close()
    assert errors and {host_of(e) for e in errors} == {"host-a"}
