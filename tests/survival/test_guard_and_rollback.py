"""Survival rules through a real engine: resource pressure, rollbacks, and business rules
that cannot silence them."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from pulse_core import (
    Decision,
    Engine,
    EventDraft,
    Inner,
    ManualClock,
    Snapshot,
    SurvivalLocked,
)
from pulse_core._effects import effect_draft
from pulse_survival import (
    RULE_ORDER,
    ResourceThresholds,
    RestartProcess,
    RollbackPolicy,
    SurvivalConfig,
    SurvivalConfigError,
    load_config,
)


class RecordingDirectory:
    """An engine directory that records the rollbacks asked of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, str]] = []

    async def rollback(self, revision: str | None, reason: str) -> str:
        self.calls.append((revision, reason))
        return f"rev-{len(self.calls)}"


async def effects_of(engine: Engine, tag: str) -> list[dict[str, Any]]:
    return [e.data["effect"] for e in await engine.events.read(kinds=["effect"])
            if e.data["effect"]["type"] == tag]


async def settle(engine: Engine) -> Decision:
    decision = await engine.tick()
    await engine.executor_loop.run_until_idle()
    return decision


def pressure(memory: float) -> dict[str, Any]:
    return {"cpu_pct": 5.0, "memory_pct": memory, "swap_pct": 0.0, "disk_pct": {"/": 40.0}}


async def test_resource_pressure_for_k_samples_archives_and_cleans_once_per_k(
    tmp_path: Path,
) -> None:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    old = time.time() - 30 * 24 * 3600
    for i in range(3):
        path = sessions / f"s{i}.jsonl"
        path.write_text("x" * 1000)
        os.utime(path, (old, old))
    (sessions / "fresh.jsonl").write_text("keep me")
    clock = ManualClock()
    config = SurvivalConfig(resource=ResourceThresholds(
        memory_pct=90, samples=3, session_folders=(str(sessions),), archive_to="archive"))
    engine = Engine(tmp_path / "home", survival=config, clock=clock)
    await engine.open()
    decisions = []
    for memory in (95, 96, 97, 97, 97, 97):
        clock.advance(5_000)
        await engine.vitals.record("system-resource", pressure(memory))
        decisions.append(await settle(engine))
    assert [d.tick_ms for d in decisions] == [1_000] * 6
    assert len(await effects_of(engine, "archive-sessions")) == 2
    assert len(await effects_of(engine, "cleanup")) == 2
    archive_ids = {e.key for e in await engine.events.read(kinds=["effect"])
                   if e.data["effect"]["type"] == "archive-sessions"}
    acked = [e.data["result"] for e in await engine.events.read(kinds=["effect-acked"])
             if e.key in archive_ids]  # cleanup runs beside it and may finish first
    assert acked[0]["moved"] == 3 and acked[0]["bytes_freed"] == 3000
    assert sorted(p.name for p in (tmp_path / "home/archive/sessions").iterdir()) == [
        "s0.jsonl", "s1.jsonl", "s2.jsonl"]
    assert (sessions / "fresh.jsonl").exists()
    clock.advance(5_000)
    await engine.vitals.record("system-resource", pressure(40))
    assert (await settle(engine)).tick_ms == 5_000
    await engine.close()


async def test_auto_rollback_after_errors_following_a_promote(tmp_path: Path) -> None:
    directory = RecordingDirectory()
    engine = Engine(tmp_path, engine_directory=directory, clock=ManualClock(),
                    survival=SurvivalConfig(rollback=RollbackPolicy(auto_errors=5)))
    await engine.open()
    await engine.append([EventDraft("error", "before", {"n": 0}) for _ in range(9)])
    await engine.append([EventDraft("promote", "engine", {"revision": "abc123"}, origin="cli")])
    await engine.append([EventDraft("error", f"e{i}", {"n": i}) for i in range(4)])
    await settle(engine)
    assert directory.calls == []
    await engine.append([EventDraft("error", "e5", {"n": 5})])
    await settle(engine)
    assert len(directory.calls) == 1
    assert "5 errors" in directory.calls[0][1] and "abc123" in directory.calls[0][1]
    notices = await effects_of(engine, "notify")
    assert [n["topic"] for n in notices] == ["rollback"]
    await engine.append([EventDraft("error", "e6", {"n": 6})])
    await settle(engine)
    await settle(engine)
    assert len(directory.calls) == 1
    await engine.close()


async def test_panic_rollback_bypasses_everything_inside_it(tmp_path: Path) -> None:
    directory = RecordingDirectory()
    business_calls: list[int] = []

    async def business(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        business_calls.append(curr.number)
        return await inner(prev, curr)

    engine = Engine(tmp_path, engine_directory=directory, rules=[business],
                    clock=ManualClock(), survival=SurvivalConfig(
                        rollback=RollbackPolicy(panic_failures=3)))
    await engine.open()
    broken = RestartProcess(name="ghost", argv=("/nonexistent/pulse-test-binary",))
    await engine.append([effect_draft(broken, origin="survival"),
                         effect_draft(RestartProcess(name="ghost2", argv=broken.argv),
                                      origin="survival")])
    for _ in range(3):
        await engine.executor_loop.run_until_idle()
        engine.clock.advance(60_000)  # type: ignore[attr-defined]
    failures = await engine.events.read(kinds=["effect-failed"])
    assert len(failures) == 4 and "pulse-test-binary" in failures[0].data["error"]
    decision = await settle(engine)
    assert business_calls == []
    assert decision.tick_ms == 1_000
    assert directory.calls and "4 survival effects failed in a row" in directory.calls[0][1]
    assert [n["level"] for n in await effects_of(engine, "notify")] == ["critical"]
    await settle(engine)
    assert business_calls == [2]  # the streak was reset by the rollback
    assert len(directory.calls) == 1
    await engine.close()


def loop_forever() -> Any:
    async def loop_forever(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        while True:  # noqa: ASYNC110 - a rule that never returns is the point of the test
            await asyncio.sleep(0.01)

    return loop_forever


def raising() -> Any:
    async def raising(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        raise RuntimeError("business bug")

    return raising


def bypassing() -> Any:
    async def bypassing(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        return Decision([], 60_000)

    return bypassing


@pytest.mark.parametrize(("rule", "errors"), [(raising(), 1), (bypassing(), 0),
                                              (loop_forever(), 1)],
                         ids=["raises", "bypasses", "loops-forever"])
async def test_a_business_rule_cannot_stop_a_survival_rule(
    tmp_path: Path, rule: Any, errors: int
) -> None:
    clock = ManualClock()
    engine = Engine(tmp_path, rules=[rule], clock=clock, rule_timeout=0.2,
                    survival=SurvivalConfig(resource=ResourceThresholds(samples=1)))
    await engine.open()
    await engine.vitals.record("system-resource", pressure(99))
    decision = await asyncio.wait_for(settle(engine), 5)
    assert len(await effects_of(engine, "cleanup")) == 1
    assert decision.tick_ms == 1_000
    assert len(await engine.events.read(kinds=["error"])) == errors
    await engine.close()


def test_user_code_cannot_remove_replace_or_reorder_survival_rules(tmp_path: Path) -> None:
    engine = Engine(tmp_path)
    assert engine.rule_names[: len(RULE_ORDER)] == RULE_ORDER
    with pytest.raises(SurvivalLocked, match="cannot be switched off"):
        Engine(tmp_path, survival=False)
    with pytest.raises(SurvivalLocked, match="panic_rollback"):
        from pulse_survival.rules import PanicRollback

        Engine(tmp_path, rules=[PanicRollback(RollbackPolicy())])
    with pytest.raises(SurvivalConfigError, match="panic_rollback"):
        load_config({"panic_rollback": False})


@pytest.mark.parametrize(("data", "field"), [
    ({"resource": {"memory_pct": 100}}, "survival.resource.memory_pct"),
    ({"rollback": {"panic_failures": 1}}, "survival.rollback.panic_failures"),
    ({"process": {"budget_per_hour": 0}}, "survival.process.budget_per_hour"),
    ({"network": {"timeout_s": "fast"}}, "network.timeout_s"),
    ({"processes": [{"name": "x"}]}, "pidfile, match_name or match_cmdline"),
])
def test_thresholds_outside_hard_bounds_are_refused_by_name(
    data: dict[str, Any], field: str
) -> None:
    with pytest.raises(SurvivalConfigError) as info:
        load_config(data)
    assert field in str(info.value)


def test_a_config_file_loads_and_bad_json_is_named(tmp_path: Path) -> None:
    good = tmp_path / "survival.json"
    good.write_text('{"rollback": {"auto_errors": 7}}')
    assert load_config(path=good).rollback.auto_errors == 7
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(SurvivalConfigError, match="not valid JSON"):
        load_config(path=bad)
