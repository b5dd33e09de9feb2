"""Survival rules see every sample since the last tick, never a sample from an earlier run,
and keep their state in the log: a restarted engine carries on where the last one stopped."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from pulse_core import (
    Decision,
    Engine,
    Inner,
    LayerContext,
    ManualClock,
    PulseError,
    Snapshot,
    decode_mark,
)
from pulse_core import load_survival_layer as survival_layer
from pulse_core._effects import effect_draft
from pulse_core._watchers import sample_once
from pulse_survival import (
    RULE_ORDER,
    SURVIVAL_MARKS,
    ErrorLogPolicy,
    Essential,
    GaveUp,
    LlmPolicy,
    LlmRestartScheduled,
    Notify,
    ProcessPolicy,
    ResourceThresholds,
    StartFailed,
    SurvivalConfig,
    SurvivalLedger,
    SurvivalLedgerData,
)
from pulse_survival.watchers import ErrorLogWatcher, ProcessAliveWatcher

SLEEPER = "import time; time.sleep(120)"
CRASHER = "raise SystemExit(3)"


def append(path: Path, text: str) -> None:
    with open(path, "a") as out:
        out.write(text)


async def effects_of(engine: Engine, tag: str) -> list[dict[str, Any]]:
    return [e.data["effect"] for e in await engine.events.read(kinds=["effect"])
            if e.data["effect"]["type"] == tag]


async def ledger_of(engine: Engine) -> SurvivalLedgerData:
    return (await engine.snapshot()).state(SurvivalLedger)


async def exited(pid: int) -> None:
    """Wait until process `pid` has exited (a zombie counts), at most 10 s."""
    async with asyncio.timeout(10):
        while True:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    return
            except psutil.NoSuchProcess:
                return
            await asyncio.sleep(0.02)


async def settle(engine: Engine) -> Decision:
    decision = await engine.tick()
    await engine.executor_loop.run_until_idle()
    return decision


# -- every sample since the last tick --------------------------------------------------------


async def test_an_error_line_replaced_by_a_quiet_sample_before_the_tick_is_still_notified(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    log = tmp_path / "app.log"
    log.write_text("")
    clock = ManualClock()
    parts: dict[str, Any] = {}

    async def busy(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        """A business rule that takes most of its time box on tick 2: meanwhile an ERROR
        line is written and the error-log watcher samples twice, the line and then quiet."""
        if curr.number == 2:
            append(log, "ERROR written while the tick was busy\n")
            for _ in range(2):
                clock.advance(100)
                await sample_once(parts["watcher"], parts["engine"].vitals)
        return await inner(prev, curr)

    engine: Engine = await open_engine(
        tmp_path / "home", clock=clock, rules=[busy], rule_timeout=5.0,
        survival=SurvivalConfig(error_log=ErrorLogPolicy(files=(str(log),))))
    (watcher,) = [w for w in engine.watchers if isinstance(w, ErrorLogWatcher)]
    parts.update(engine=engine, watcher=watcher)
    await sample_once(watcher, engine.vitals)  # following starts
    await settle(engine)
    await settle(engine)  # busy: both samples land after this tick's snapshot
    newest = (await engine.vitals.latest(["error-log"]))["error-log"]
    assert newest.data["matches"] == 0  # the ERROR sample was replaced before the next tick
    assert await effects_of(engine, "notify") == []

    clock.advance(100)
    await settle(engine)
    (notice,) = await effects_of(engine, "notify")
    assert notice["topic"] == "error-log"
    assert notice["text"].startswith("1 error lines in the logs")
    assert notice["quoted"][-1]["text"] == "ERROR written while the tick was busy"
    assert [e.key for e in await engine.events.read(kinds=["notification"])] == ["error-log"]


def memory(pct: float) -> dict[str, Any]:
    return {"cpu_pct": 5.0, "memory_pct": pct, "swap_pct": 0.0, "disk_pct": {"/": 40.0}}


async def test_pressure_for_k_samples_between_two_ticks_fires_though_it_eased_before_the_tick(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    clock = ManualClock()
    engine: Engine = await open_engine(
        tmp_path / "home", clock=clock,
        survival=SurvivalConfig(resource=ResourceThresholds(memory_pct=90, samples=3)))
    for pct in (95, 96, 97, 40):
        clock.advance(1_000)
        await engine.vitals.record("system-resource", memory(pct))
    decision = await settle(engine)
    assert len(await effects_of(engine, "cleanup")) == 1
    assert decision.tick_ms == 5_000  # no pressure any more: the calm tick
    assert (await ledger_of(engine)).streak("resource_guard") == 0


async def test_an_outage_and_its_end_between_two_ticks_are_both_announced(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    clock = ManualClock()
    engine: Engine = await open_engine(tmp_path / "home", clock=clock, survival=SurvivalConfig())
    for up in (False, False, True):
        clock.advance(1_000)
        await engine.vitals.record("network", {"dns_ok": up, "http_ok": up})
    await settle(engine)
    assert [n["level"] for n in await effects_of(engine, "notify")] == ["outage", "recovered"]
    assert (await ledger_of(engine)).network_down is False


async def test_a_running_process_is_not_restarted_on_a_dead_sample_left_by_the_last_run(
    tmp_path: Path, reaper: list[int]
) -> None:
    home = tmp_path / "home"
    pidfile = tmp_path / "worker.pid"
    argv = (sys.executable, "-c", SLEEPER, str(tmp_path))  # a command line of its own
    config = SurvivalConfig(processes=(Essential(name="worker", argv=argv,
                                                 pidfile=str(pidfile)),))
    clock = ManualClock()

    previous = Engine(home, clock=clock, survival=config)
    await previous.open()
    (watcher,) = [w for w in previous.watchers if isinstance(w, ProcessAliveWatcher)]
    stale = await sample_once(watcher, previous.vitals)  # its last sample: worker dead
    assert stale.data["worker"]["alive"] is False
    await previous.close()

    worker = subprocess.Popen(argv)  # noqa: ASYNC220 - returns at once
    reaper.append(worker.pid)
    pidfile.write_text(f"{worker.pid}\n")
    written = pidfile.stat().st_mtime_ns
    clock.advance(1_000)
    engine = Engine(home, clock=clock, survival=config)
    await engine.open()
    try:
        assert (await engine.vitals.latest(["process-alive"]))["process-alive"] == stale
        await settle(engine)  # the first tick, before this engine sampled anything
        clock.advance(1_000)
        await engine.step()  # its own sample: alive
        assert await effects_of(engine, "restart-process") == []
        assert int(pidfile.read_text()) == worker.pid
        assert pidfile.stat().st_mtime_ns == written
        assert [p.pid for p in psutil.process_iter(["cmdline"])
                if p.info["cmdline"] == list(argv)] == [worker.pid]
    finally:
        reaper += [e.data["result"]["pid"] for e in await engine.events.read(
            kinds=["effect-acked"]) if "pid" in (e.data["result"] or {})]
        await engine.close()


# -- state in the log, across restarts -------------------------------------------------------


async def test_failed_starts_backoff_and_giving_up_carry_on_across_engine_restarts(
    tmp_path: Path
) -> None:
    home = tmp_path / "home"
    config = SurvivalConfig(
        processes=(Essential(name="crasher", argv=(sys.executable, "-c", CRASHER, str(tmp_path)),
                             pidfile=str(tmp_path / "crasher.pid")),),
        process=ProcessPolicy(startretries=3, budget_per_hour=50, backoff_initial_s=1,
                              backoff_max_s=60))
    clock = ManualClock()
    started = clock.now_ms()

    async def step(engine: Engine) -> None:
        await engine.step()
        for acked in await engine.events.read(kinds=["effect-acked"]):
            if "pid" in acked.data["result"]:
                await exited(acked.data["result"]["pid"])

    async def restarts(engine: Engine) -> list[int]:
        return [e.ts - started for e in await engine.events.read(kinds=["effect"])
                if e.data["effect"]["type"] == "restart-process"]

    first = Engine(home, clock=clock, survival=config)
    await first.open()
    await step(first)  # dead: restart at 0
    clock.advance(500)
    await step(first)  # dead again: a failed start; the next restart waits 2 s
    assert await restarts(first) == [0]
    assert (await ledger_of(first)).process("crasher").failed_starts == 1
    await first.close()

    clock.advance(1_000)
    second = Engine(home, clock=clock, survival=config)
    await second.open()
    await step(second)  # 1.5 s: still inside the backoff the first engine started
    assert await restarts(second) == [0]
    clock.advance(500)
    await step(second)  # 2 s: the backoff is over
    assert await restarts(second) == [0, 2_000]
    for _ in range(6):
        clock.advance(4_000)
        await step(second)
    assert await restarts(second) == [0, 2_000, 6_000]  # then 3 failed starts: given up
    last_seen = await ledger_of(second)
    await second.close()

    shutil.rmtree(home / "checkpoints", ignore_errors=True)  # fold the log afresh
    clock.advance(60_000)
    third = Engine(home, clock=clock, survival=config)
    await third.open()
    try:
        assert await ledger_of(third) == last_seen
        record = last_seen.process("crasher")
        assert (record.failed_starts, record.given_up) == (3, "3 failed starts in a row")
        await step(third)
        assert len(await restarts(third)) == 3
        assert [n["level"] for n in await effects_of(third, "notify")] == ["given-up"]
        marks = [decode_mark(e) for e in await third.events.read(kinds=["mark"])]
        assert [m.restart_at - started for m in marks if isinstance(m, StartFailed)] == [
            0, 2_000, 6_000]
        assert [m.why for m in marks if isinstance(m, GaveUp)] == ["3 failed starts in a row"]
    finally:
        await third.close()


async def test_the_llm_restart_backoff_carries_on_across_an_engine_restart(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    config = SurvivalConfig(llm=LlmPolicy(failures=2, backoff_initial_s=10))
    clock = ManualClock()
    started = clock.now_ms()

    async def probe(engine: Engine, ok: bool) -> None:
        clock.advance(1_000)
        await engine.vitals.record("llm-route", {"ok": ok})
        await settle(engine)

    first: Engine = await open_engine(tmp_path / "home", clock=clock, survival=config)
    for _ in range(2):
        await probe(first, False)
    assert len(await effects_of(first, "notify")) == 1  # no proxy configured: a notice
    await first.close()

    second: Engine = await open_engine(tmp_path / "home", clock=clock, survival=config)
    for _ in range(4):  # still inside the first engine's 10 s backoff
        await probe(second, False)
    assert len(await effects_of(second, "notify")) == 1
    clock.advance(5_000)
    await probe(second, False)
    assert len(await effects_of(second, "notify")) == 2
    scheduled = [m for m in map(decode_mark, await second.events.read(kinds=["mark"]))
                 if isinstance(m, LlmRestartScheduled)]
    assert [(m.count, m.next_allowed_at - started) for m in scheduled] == [
        (1, 2_000 + 10_000), (2, 12_000 + 20_000)]


async def test_a_pressure_streak_carries_on_across_an_engine_restart(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    config = SurvivalConfig(resource=ResourceThresholds(memory_pct=90, samples=3))
    clock = ManualClock()
    pressure = {"cpu_pct": 5.0, "memory_pct": 97.0, "swap_pct": 0.0, "disk_pct": {"/": 40.0}}

    async def sample(engine: Engine) -> None:
        clock.advance(5_000)
        await engine.vitals.record("system-resource", pressure)
        await settle(engine)

    first: Engine = await open_engine(tmp_path / "home", clock=clock, survival=config)
    await sample(first)
    await sample(first)
    assert await effects_of(first, "cleanup") == []
    await first.close()

    second: Engine = await open_engine(tmp_path / "home", clock=clock, survival=config)
    await sample(second)  # the third sample in a row
    assert len(await effects_of(second, "cleanup")) == 1
    assert (await ledger_of(second)).streak("resource_guard") == 0


async def test_a_notice_is_not_state_only_the_watchdogs_own_marks_are(
    tmp_path: Path, reaper: list[int], open_engine: Callable[..., Any]
) -> None:
    pidfile = tmp_path / "worker.pid"
    config = SurvivalConfig(processes=(Essential(
        name="worker", argv=(sys.executable, "-c", SLEEPER, str(tmp_path)),
        pidfile=str(pidfile)),))
    engine: Engine = await open_engine(tmp_path / "home", clock=ManualClock(), survival=config)
    lookalike = Notify(topic="process:worker", level="given-up", text="gave up restarting")
    await engine.append([effect_draft(lookalike, origin="survival")])
    await engine.executor_loop.run_until_idle()
    assert (await ledger_of(engine)).process("worker").given_up is None
    await engine.step()
    (acked,) = [e for e in await engine.events.read(kinds=["effect-acked"])
                if "pid" in (e.data["result"] or {})]
    reaper.append(acked.data["result"]["pid"])
    assert len(await effects_of(engine, "restart-process")) == 1


# -- the entry point -------------------------------------------------------------------------


def test_the_layer_takes_config_json_settings_and_names_a_wrong_field(tmp_path: Path) -> None:
    context = LayerContext(tmp_path, ManualClock())
    layer = survival_layer({"rollback": {"auto_errors": 7}}, context)
    assert layer.name == "survival"
    assert tuple(getattr(r, "name", "") for r in layer.rules) == RULE_ORDER
    assert [p.name for p in layer.projections] == ["survival"]
    assert survival_layer(None, context).rules[1].policy.auto_errors == 5  # type: ignore[attr-defined]
    assert layer.rules[1].policy.auto_errors == 7  # type: ignore[attr-defined]

    with pytest.raises(PulseError) as info:
        Engine(tmp_path, survival={"rollback": {"auto_errorz": 7}})
    assert "survival.rollback: unknown field 'auto_errorz'" in str(info.value)
    assert str(info.value).endswith("allowed: panic_failures, auto_errors, auto_window_s")


def test_every_survival_mark_is_in_the_catalogue_of_the_docs() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "survival.md").read_text()
    for mark in SURVIVAL_MARKS:
        assert f"| `{mark.tag()}` | `{mark.__name__}` |" in page, mark.__name__
