"""The `maintenance` layer in a real Engine: switched on from config.json's settings, its rule
starts cycles on the schedule and on every trigger, one at a time, wakes the tick when the next
is due, and a cycle interrupted by an engine restart resumes with its cycle_start."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pulse_adapters.maintenance import (
    DecaySettings,
    MaintenanceCycle,
    MaintenanceExecutor,
    MaintenanceRule,
    MaintenanceSettings,
    MaintenanceSettingsError,
    Triggers,
    layer,
    request_cycle,
)
from pulse_adapters.maintenance._context import fold
from pulse_adapters.maintenance._executor import cycle_id
from pulse_core import (
    Engine,
    EventDraft,
    LayerContext,
    LayerError,
    ManualClock,
    MemoryBoard,
    available_layers,
    load_layer,
    load_layers,
)
from pulse_core._projector import checkpoint_seqs
from pulse_core.maintenance import ElementsReader
from pulse_core.maintenance._activities import read_activity
from pulse_core.maintenance._sleep import SleepBoard
from pulse_core.maintenance._watches import (
    WatchArmed,
    WatchCondition,
    Watches,
    arm_watch,
    evaluate_watches,
    read_watch,
)
from pulse_core.memory import identity_key
from pulse_core.store import open_event_store

HOUR = 3_600_000
DAY = 24 * HOUR
QUIET = {"schedule": {"every_h": [12, 24]}, "triggers": {"min_gap_s": 600}}


def engine_with(home: Path, clock: ManualClock, settings: Any = None, *,
                store: str | None = None) -> Engine:
    """An engine running the maintenance layer on the log at `store` (default: the home's
    SQLite file), a long default tick, so the rule's hint is what shows; close interrupts
    attempts in flight at once."""
    built = layer(settings, LayerContext(home, clock))
    return Engine(home, layers=[built], clock=clock, default_tick_ms=2 * DAY,
                  drain_timeout=0.0, store=store)


@contextlib.asynccontextmanager
async def opened(home: Path, clock: ManualClock, settings: Any = None, *,
                 store: str | None = None) -> AsyncIterator[Engine]:
    """The engine opened, its loops not started: ticks and executors are the test's."""
    engine = engine_with(home, clock, settings, store=store)
    await engine.open()
    try:
        yield engine
    finally:
        await engine.close()


async def cycles(engine: Engine) -> list[Any]:
    return [e.data["effect"] for e in await engine.events.read(kinds=["effect"])
            if e.data["effect"]["type"] == "maintenance-cycle"]


async def tick_and_run(engine: Engine) -> int:
    decision = await engine.tick()
    await engine.executor_loop.run_until_idle()
    return decision.tick_ms


async def rule_sees(engine: Engine) -> tuple[MaintenanceCycle | None, int | None]:
    """What the layer's rule decides over the engine's next snapshot: a cycle to start, and
    the ms until the next one may be due (its tick hint)."""
    (maintenance,) = [la for la in engine.layers if la.name == "maintenance"]
    (rule,) = maintenance.rules
    assert isinstance(rule, MaintenanceRule)
    return rule.due(await engine.snapshot())


def test_the_layer_is_installed_as_maintenance_and_built_from_config_json(
    tmp_path: Path,
) -> None:
    assert "maintenance" in available_layers()
    config = json.loads('{"layers": {"maintenance": {"schedule": {"daily_at": "03:00", '
                        '"tz": "Europe/Lisbon"}, "grants": ["read", "maintain"]}}}')
    (built,) = load_layers(config["layers"], LayerContext(tmp_path, ManualClock()))
    assert built.name == "maintenance"
    assert [type(r).__name__ for r in built.rules] == ["MaintenanceRule"]
    assert [e.name for e in built.executors] == ["maintenance"]
    assert {p.name for p in built.projections} == {
        "maintenance", "schedules", "sleep-tasks", "watches", "elements", "beliefs"}
    assert built.rules[0].settings.grants == ("read", "maintain")  # type: ignore[attr-defined]
    assert load_layer("maintenance", None, LayerContext(tmp_path, ManualClock())).rules


@pytest.mark.parametrize(("settings", "message"), [
    ({"decay": {"factor": 1.5}}, "`layers.maintenance.decay.factor` must be within (0, 1)"),
    ({"budgets": {"max_writes": 0}}, "`layers.maintenance.budgets.max_writes` must be within 1.."),
    ({"schedule": {"daily_at": "25:00"}}, "`layers.maintenance.schedule.daily_at` must be HH:MM"),
    ({"grants": ["read", "rule_the_world"]}, "`layers.maintenance.grants` names 'rule_the_world'"),
    ({"retention": {"purge_after_days": 3}}, "unknown field `purge_after_days`"),
    ({"consolidation": {"proposer": "llm"}}, "setting `layers.maintenance.consolidation.base_url`"),
    ([], "layers.maintenance must be a JSON object"),
])
def test_a_wrong_setting_is_refused_naming_the_field(
    tmp_path: Path, settings: Any, message: str,
) -> None:
    with pytest.raises(LayerError, match="maintenance") as caught:
        load_layer("maintenance", settings, LayerContext(tmp_path, ManualClock()))
    assert message in str(caught.value)
    with pytest.raises(MaintenanceSettingsError):
        layer(settings, LayerContext(tmp_path, ManualClock()))


async def test_the_first_tick_runs_a_scheduled_cycle_and_the_tick_wakes_for_the_next(
    tmp_path: Path, store_url: str,
) -> None:
    clock = ManualClock()
    async with opened(tmp_path, clock, QUIET, store=store_url) as engine:
        await engine.append([EventDraft("human-exchange", identity_key("ana"),
                                        {"record": "x-1", "text": "hi"}, origin="human")])
        await tick_and_run(engine)
        (first,) = await cycles(engine)
        assert first["trigger"] == "scheduled"
        assert await tick_and_run(engine) == 60_000  # the built-in clamp bounds every tick
        cycle, hint = await rule_sees(engine)
        assert cycle is None and hint is not None
        assert 12 * HOUR <= hint <= 24 * HOUR  # the tick hint: when the schedule is due
        fired = await engine.events.read(kinds=["schedule-fired"])
        assert [e.key for e in fired] == ["schedule:maintenance"]
        (effect,) = await engine.events.read(kinds=["effect"])
        activity = await read_activity(engine.events, cycle_id(effect.key))
        assert activity is not None and activity.status == "completed"
        assert activity.report["changes"] == {"decayed": 1}
        assert len(await cycles(engine)) == 1
        clock.advance(hint)
        await tick_and_run(engine)
        assert [c["trigger"] for c in await cycles(engine)] == ["scheduled", "scheduled"]


async def test_a_requested_cycle_starts_at_the_next_tick(tmp_path: Path, store_url: str) -> None:
    clock = ManualClock()
    async with opened(tmp_path, clock, QUIET, store=store_url) as engine:
        await tick_and_run(engine)
        await request_cycle(engine.events, "the agent asked after a hard day")
        await tick_and_run(engine)
        await tick_and_run(engine)
        triggers = [(c["trigger"], c["reason"]) for c in await cycles(engine)]
        assert triggers[1:] == [("on-demand", "the agent asked after a hard day")]


async def test_a_long_session_starts_a_cycle_once_the_gap_has_passed(
    tmp_path: Path, store_url: str,
) -> None:
    clock = ManualClock()
    settings = {**QUIET, "triggers": {"post_session_exchanges": 5, "min_gap_s": 600}}
    async with opened(tmp_path, clock, settings, store=store_url) as engine:
        await tick_and_run(engine)
        await engine.append([EventDraft("human-exchange", identity_key("ana"),
                                        {"record": f"x-{i}", "text": "hi"}, origin="human")
                             for i in range(5)])
        await tick_and_run(engine)
        assert len(await cycles(engine)) == 1  # within the gap after the first cycle
        clock.advance(601_000)
        await tick_and_run(engine)
        await tick_and_run(engine)
        last = (await cycles(engine))[-1]
        assert (last["trigger"], last["reason"]) == (
            "post-session", "5 human exchanges with ana since the last cycle")
        assert len(await cycles(engine)) == 2


async def test_a_backlog_of_sleep_tasks_starts_a_cycle(tmp_path: Path, store_url: str) -> None:
    clock = ManualClock()
    settings = {**QUIET, "triggers": {"backlog": 3, "min_gap_s": 60}}
    async with opened(tmp_path, clock, settings, store=store_url) as engine:
        await tick_and_run(engine)
        board = SleepBoard(engine.events, "agent", clock=clock)
        for i in range(3):
            await board.create("review_derived", subject=f"ana/x-{i}", assigned_to="maintenance")
        clock.advance(61_000)
        await tick_and_run(engine)
        assert [c["trigger"] for c in await cycles(engine)] == ["scheduled", "backlog"]
        done = Counter(e.kind for e in await engine.events.read(
            kinds=["sleep-task-completed", "sleep-task-failed"]))
        assert done == {"sleep-task-completed": 3}


async def test_a_silence_watch_wakes_the_tick_at_its_due_time_and_a_cycle_fires_it(
    tmp_path: Path, store_url: str,
) -> None:
    clock = ManualClock()
    async with opened(tmp_path, clock, QUIET, store=store_url) as engine:
        await tick_and_run(engine)
        await arm_watch(engine.events, "bob-quiet", WatchArmed(
            watch_class="silence", condition=WatchCondition(key_prefix="identity:bob"),
            due_at=clock.now_ms() + HOUR), origin="agent")
        await tick_and_run(engine)
        assert (await rule_sees(engine)) == (None, HOUR)  # the tick wakes at its due time
        clock.advance(HOUR)
        await tick_and_run(engine)
        assert [c["trigger"] for c in await cycles(engine)] == ["scheduled", "watch"]
        fired = await engine.events.read(kinds=["watch-fired"])
        assert [e.key for e in fired] == ["watch:bob-quiet"]


async def test_one_cycle_at_a_time_however_many_ticks_see_it_due(
    tmp_path: Path, store_url: str,
) -> None:
    clock = ManualClock()
    async with opened(tmp_path, clock, QUIET, store=store_url) as engine:
        await engine.tick()
        await request_cycle(engine.events, "again")
        await engine.tick()
        await engine.tick()
        assert len(await cycles(engine)) == 1  # the first is still pending
        await engine.executor_loop.run_until_idle()
        await tick_and_run(engine)
        assert len(await cycles(engine)) == 1  # the request came before it began: served
        await request_cycle(engine.events, "once more")
        await tick_and_run(engine)
        assert [c["trigger"] for c in await cycles(engine)] == ["scheduled", "on-demand"]


async def test_a_cycle_cut_short_by_an_engine_restart_resumes_with_its_cycle_start(
    tmp_path: Path, store_url: str,
) -> None:
    clock = ManualClock()
    settings = MaintenanceSettings(triggers=Triggers(min_gap_s=600),
                                   decay=DecaySettings(limit=5))
    engine = engine_with(tmp_path, clock, settings, store=store_url)
    await engine.open()  # closed below, mid-cycle
    await engine.append([EventDraft("human-exchange", identity_key(f"p{i}"),
                                    {"record": f"x-{i}", "text": "hi"}, origin="human")
                         for i in range(40)])
    await engine.tick()
    running = asyncio.ensure_future(engine.executor_loop.run_until_idle())
    async for _ in engine.events.changes(0, kinds=["memory-metabolized"]):
        break
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    await engine.close()  # drain_timeout 0: the attempt is interrupted, left to retry
    (effect,) = await _effects(store_url)
    started = await _activity(store_url, cycle_id(effect))
    assert started["status"] == "running"

    clock.advance(HOUR)  # past the retry delay and the lease
    async with opened(tmp_path, clock, settings, store=store_url) as again:
        await again.executor_loop.run_until_idle()
        activity = await read_activity(again.events, cycle_id(effect))
        assert activity is not None and activity.status == "completed"
        assert activity.started_at == started["started_at"]
        per_record: Counter[str] = Counter()
        for event in await again.events.read(kinds=["memory-metabolized"]):
            assert event.data["cycle_start"] == started["started_at"]
            per_record.update(list(event.data["strengths"]))
        assert len(per_record) == 40 and set(per_record.values()) == {1}


async def _effects(url: str) -> list[str]:
    store = await open_event_store(url, read_only=True)
    try:
        return [e.key for e in await store.read(kinds=["effect"])
                if e.data["effect"]["type"] == MaintenanceCycle.tag()]
    finally:
        await store.close()


async def _activity(url: str, activity_id: str) -> dict[str, Any]:
    store = await open_event_store(url, read_only=True)
    try:
        activity = await read_activity(store, activity_id)
        assert activity is not None
        return {"status": activity.status, "started_at": activity.started_at}
    finally:
        await store.close()


async def test_an_llm_proposer_is_built_from_the_settings_and_its_client_closed_with_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = {"consolidation": {"proposer": "llm", "base_url": "http://127.0.0.1:9/v1",
                                  "model": "stand-in", "api_key_env": "PULSE_TEST_MAINT_KEY"}}
    context = LayerContext(tmp_path, ManualClock())
    monkeypatch.delenv("PULSE_TEST_MAINT_KEY", raising=False)
    with pytest.raises(LayerError, match=r"`consolidation\.api_key_env`.*PULSE_TEST_MAINT_KEY"):
        load_layer("maintenance", settings, context)
    monkeypatch.setenv("PULSE_TEST_MAINT_KEY", "sk-test")
    built = load_layer("maintenance", settings, context)
    assert built.services == () and built.lifespan is not None
    (executor,) = built.executors
    assert isinstance(executor, MaintenanceExecutor) and executor.proposer is not None
    http = executor.proposer.client._http  # type: ignore[attr-defined]
    engine = Engine(tmp_path / "home", layers=[built], clock=ManualClock())
    await engine.open()
    assert not http.is_closed  # held open while the engine runs
    await engine.close()
    assert http.is_closed
    off = load_layer("maintenance", {}, context)
    assert off.lifespan is None and off.executors[0].proposer is None  # type: ignore[attr-defined]


async def test_a_watch_fired_elsewhere_starts_a_cycle_that_reviews_it(
    tmp_path: Path, store_url: str,
) -> None:
    clock = ManualClock()
    async with opened(tmp_path, clock, QUIET, store=store_url) as engine:
        await tick_and_run(engine)
        await arm_watch(engine.events, "ana-news", WatchArmed(
            watch_class="delta", condition=WatchCondition(key_prefix="identity:ana")),
            origin="agent")
        await engine.append([EventDraft("human-exchange", identity_key("ana"),
                                        {"record": "x-9", "text": "news"}, origin="human")])
        watches = await fold(engine.events, Watches())
        fired = await evaluate_watches(engine.events, watches, 0, clock.now_ms(), origin="agent")
        assert len(fired.fired) == 1  # another evaluator (the agent's own) fired it
        clock.advance(601_000)
        await tick_and_run(engine)
        last = (await cycles(engine))[-1]
        assert last["trigger"] == "watch" and last["reason"].startswith("watch fired: task")
        watch = await read_watch(engine.events, "ana-news")
        assert watch is not None and watch.decision is None  # the decision is the agent's
        (done,) = await engine.events.read(kinds=["sleep-task-completed"])
        assert done.data["outcome"]["decision"] == "surfaced"


async def test_a_daily_schedule_waits_for_its_local_time(tmp_path: Path, store_url: str) -> None:
    clock = ManualClock(1_700_000_000_000)  # 2023-11-14 22:13:20 in Lisbon (WET, UTC+0)
    settings = {"schedule": {"daily_at": "03:00", "tz": "Europe/Lisbon"}}
    async with opened(tmp_path, clock, settings, store=store_url) as engine:
        await engine.append([EventDraft("human-exchange", identity_key("ana"),
                                        {"record": "x-1", "text": "hi"}, origin="human")])
        await tick_and_run(engine)
        assert await cycles(engine) == []
        three_am = 1_700_017_200_000  # 2023-11-15 03:00 Europe/Lisbon
        assert await rule_sees(engine) == (None, three_am - clock.now_ms())
        clock.advance(three_am - clock.now_ms())
        await tick_and_run(engine)
        (cycle,) = await cycles(engine)
        assert (cycle["trigger"], cycle["due_at"]) == ("scheduled", three_am)


async def test_the_executor_checkpoints_the_elements_so_a_restarted_engine_folds_only_the_tail(
        tmp_path: Path, store_url: str) -> None:
    clock = ManualClock()
    folder = tmp_path / "checkpoints" / "maintenance"
    async with opened(tmp_path, clock, QUIET, store=store_url) as engine:
        for n in range(30):
            await MemoryBoard(engine.events).exchange("ana", f"hello {n}")
        await tick_and_run(engine)  # the first cycle: the whole log, then saved
        first = checkpoint_seqs(folder)["elements"]
        assert 30 < first <= await engine.events.last_seq()
    async with opened(tmp_path, clock, QUIET, store=store_url) as engine:
        reader = ElementsReader(engine.events, checkpoints=folder)
        assert reader.cursor == first  # where a restarted executor's reader starts
        assert await reader.current() == await ElementsReader(engine.events).current()
        await MemoryBoard(engine.events).exchange("bob", "late")
        await request_cycle(engine.events, "after the restart")
        await tick_and_run(engine)
        await tick_and_run(engine)
        assert len(await cycles(engine)) == 2
        assert checkpoint_seqs(folder)["elements"] > first
