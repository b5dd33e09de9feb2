"""Essential processes as supervisorctl shows them, computed from real ledger events and real
process-alive samples of real processes."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from pulse_core import Engine, ManualClock
from pulse_survival import (
    Essential,
    ProcessPolicy,
    ProcessState,
    SupervisedState,
    SurvivalConfig,
    process_states,
    supervised_states,
)
from tests.processes import exited
from tests.timing import eventually

SLEEPER = "import time; time.sleep(120)"
CRASHER = "raise SystemExit(3)"
HOUR_MS = 3_600_000


def spec(tmp_path: Path, name: str, code: str | None) -> Essential:
    """An essential process found by its pidfile, restarted with `code` (None: no argv)."""
    argv = () if code is None else (sys.executable, "-c", code, str(tmp_path))  # its own
    return Essential(name=name, argv=argv, pidfile=str(tmp_path / f"{name}.pid"))


def running(tmp_path: Path, name: str, reaper: list[int]) -> subprocess.Popen[bytes]:
    """A sleeper started by the test, with its pid in `name`'s pidfile."""
    child = subprocess.Popen([sys.executable, "-c", SLEEPER])
    reaper.append(child.pid)
    (tmp_path / f"{name}.pid").write_text(str(child.pid))
    return child


async def engine_with(open_engine: Callable[..., Any], tmp_path: Path, clock: ManualClock,
                      *processes: Essential, **policy: Any) -> Engine:
    engine: Engine = await open_engine(tmp_path / "home", clock=clock, survival=SurvivalConfig(
        processes=processes, process=ProcessPolicy(**policy)))
    return engine


async def only(engine: Engine) -> ProcessState:
    (state,) = await process_states(engine)
    return state


async def step_after_exit(engine: Engine, clock: ManualClock) -> None:
    """Wait until every process the engine started has exited (a crasher takes as long as a
    Python start on this machine), move the clock on, and run one step."""
    for acked in await engine.events.read(kinds=["effect-acked"]):
        pid = (acked.data["result"] or {}).get("pid")
        if pid is not None:
            await eventually(functools.partial(exited, pid), what=f"the exit of process {pid}")
    clock.advance(100)
    await engine.step()


async def test_a_process_never_sampled_is_unknown(
        open_engine: Callable[..., Any], tmp_path: Path) -> None:
    engine = await engine_with(open_engine, tmp_path, ManualClock(),
                               spec(tmp_path, "worker", SLEEPER))
    state = await only(engine)
    assert state.state is SupervisedState.UNKNOWN and state.pid is None
    assert state.sampled_at is None and state.restarts_last_hour == 0


async def test_a_live_process_is_starting_until_up_startsecs_then_running(
        open_engine: Callable[..., Any], tmp_path: Path, reaper: list[int]) -> None:
    child = running(tmp_path, "worker", reaper)
    clock = ManualClock()
    engine = await engine_with(open_engine, tmp_path, clock, spec(tmp_path, "worker", SLEEPER),
                               startsecs=30)
    await engine.step()
    starting = await only(engine)
    assert starting.state is SupervisedState.STARTING and starting.pid == child.pid
    clock.advance(31_000)  # the sample is as it was; its uptime is counted on to now
    later = await only(engine)
    assert later.state is SupervisedState.RUNNING and later.pid == child.pid
    assert later.uptime_s is not None and later.uptime_s >= 31
    assert later.restarts_last_hour == 0 and later.given_up_why is None


async def test_a_dead_process_is_starting_once_restarted_then_backoff_after_a_failed_start(
        open_engine: Callable[..., Any], tmp_path: Path) -> None:
    clock = ManualClock()
    engine = await engine_with(open_engine, tmp_path, clock, spec(tmp_path, "crasher", CRASHER),
                               startretries=5, backoff_initial_s=10)
    await engine.step()  # seen dead: restarted at once (no earlier restart to back off from)
    restarted = await only(engine)
    assert restarted.state is SupervisedState.STARTING
    assert restarted.restarts_last_hour == 1 and restarted.last_restart_at == clock.now_ms()
    await step_after_exit(engine, clock)  # dead again: a failed start; the next waits 20 s
    backoff = await only(engine)
    assert backoff.state is SupervisedState.BACKOFF and backoff.failed_starts == 1
    assert backoff.next_restart_at == restarted.last_restart_at + 20_000
    assert backoff.pid is None and backoff.uptime_s is None


async def test_a_process_the_watchdog_gave_up_on_is_fatal_with_the_reason(
        open_engine: Callable[..., Any], tmp_path: Path) -> None:
    clock = ManualClock()
    engine = await engine_with(open_engine, tmp_path, clock, spec(tmp_path, "crasher", CRASHER),
                               startretries=1)
    await engine.step()
    await step_after_exit(engine, clock)
    fatal = await only(engine)
    assert fatal.state is SupervisedState.FATAL
    assert fatal.given_up_why == "1 failed starts in a row"
    assert fatal.restarts_last_hour == 1 and fatal.next_restart_at is None


async def test_a_given_up_process_that_comes_back_is_running_again(
        open_engine: Callable[..., Any], tmp_path: Path, reaper: list[int]) -> None:
    clock = ManualClock()
    engine = await engine_with(open_engine, tmp_path, clock, spec(tmp_path, "worker", CRASHER),
                               startretries=1, startsecs=0)
    await engine.step()
    await step_after_exit(engine, clock)
    assert (await only(engine)).state is SupervisedState.FATAL
    child = running(tmp_path, "worker", reaper)  # started by hand
    clock.advance(100)
    await engine.step()  # seen alive: the watchdog records the recovery
    back = await only(engine)
    assert back.state is SupervisedState.RUNNING and back.pid == child.pid
    assert back.given_up_why is None


async def test_a_dead_process_without_argv_is_exited_not_backoff(
        open_engine: Callable[..., Any], tmp_path: Path) -> None:
    engine = await engine_with(open_engine, tmp_path, ManualClock(),
                               spec(tmp_path, "external", None))
    await engine.step()
    state = await only(engine)
    assert state.state is SupervisedState.EXITED and state.restarts_last_hour == 0


async def test_restarts_older_than_an_hour_leave_the_count_but_not_the_last_restart(
        open_engine: Callable[..., Any], tmp_path: Path) -> None:
    clock = ManualClock()
    processes = (spec(tmp_path, "crasher", CRASHER),)
    engine = await engine_with(open_engine, tmp_path, clock, *processes, startretries=5)
    await engine.step()
    snapshot = await engine.snapshot()
    policy = ProcessPolicy(startretries=5)
    (now,) = supervised_states(snapshot, processes, policy)
    (later,) = supervised_states(msgspec.structs.replace(snapshot, at=snapshot.at + HOUR_MS),
                                 processes, policy)
    assert now.restarts_last_hour == 1 and later.restarts_last_hour == 0
    assert later.last_restart_at == now.last_restart_at is not None


async def test_an_engine_without_essential_processes_has_no_states(
        open_engine: Callable[..., Any], tmp_path: Path) -> None:
    engine = await engine_with(open_engine, tmp_path, ManualClock())
    await engine.step()
    assert await process_states(engine) == []


async def test_states_encode_as_supervisorctl_words(
        open_engine: Callable[..., Any], tmp_path: Path) -> None:
    engine = await engine_with(open_engine, tmp_path, ManualClock(),
                               spec(tmp_path, "worker", SLEEPER))
    encoded = msgspec.to_builtins(await process_states(engine))
    assert encoded[0]["state"] == "UNKNOWN" and encoded[0]["name"] == "worker"
    assert msgspec.convert(encoded, list[ProcessState]) == await process_states(engine)
