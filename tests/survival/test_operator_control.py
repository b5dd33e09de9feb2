"""An operator's start, stop, restart and reset of an essential process: each a
`process-requested` event that process_watchdog reads and acts on through its executors,
with real processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from pulse_core import (
    Engine,
    Event,
    EventDraft,
    ExecutionContext,
    ManualClock,
    Principal,
    PrincipalRefused,
    SqliteEventStore,
)
from pulse_survival import (
    PROCESS_REQUESTED,
    Essential,
    ProcessPolicy,
    ProcessRequestRefused,
    ProcessState,
    SupervisedState,
    SurvivalConfig,
    UnknownProcess,
    check_request,
    process_states,
    request_draft,
    request_process,
)
from tests.processes import MAIN_THREAD_LEAVES, alive
from tests.timing import eventually

SLEEPER = "import time; time.sleep(120)"
CRASHER = "raise SystemExit(3)"


def worker(tmp_path: Path, code: str = SLEEPER) -> Essential:
    """`worker`, found by its pidfile, started with a command line of this test's own."""
    return Essential(name="worker", argv=(sys.executable, "-c", code, str(tmp_path)),
                     pidfile=str(tmp_path / "worker.pid"), log=str(tmp_path / "worker.log"))


def config(*processes: Essential, **policy: Any) -> SurvivalConfig:
    return SurvivalConfig(processes=processes, process=ProcessPolicy(**{
        "startsecs": 0, "budget_per_hour": 50, **policy}))


async def state_of(engine: Engine) -> ProcessState:
    (state,) = await process_states(engine)
    return state


async def effects(engine: Engine, tag: str) -> list[Event]:
    return [e for e in await engine.events.read(kinds=["effect"])
            if e.data["effect"]["type"] == tag]


async def started_pid(engine: Engine, reaper: list[int]) -> int:
    """The pid of the newest process a restart-process effect started (or adopted)."""
    restarts = {e.key for e in await effects(engine, "restart-process")}
    acked = [e for e in await engine.events.read(kinds=["effect-acked"]) if e.key in restarts]
    pid = int(acked[-1].data["result"]["pid"])
    reaper.append(pid)
    return pid


async def test_stop_keeps_the_process_stopped_until_it_is_started_again(
    tmp_path: Path, reaper: list[int], open_engine: Callable[..., Any]
) -> None:
    clock = ManualClock()
    engine: Engine = await open_engine(tmp_path / "home", clock=clock,
                                       survival=config(worker(tmp_path)))
    await engine.step()  # not running: the watchdog starts it
    first = await started_pid(engine, reaper)
    await eventually(lambda: alive(first), what="the worker to run")

    asked = await request_process(engine.events, "worker", "stop", origin="cli",
                                  reason="maintenance window")
    assert asked.origin == "human:cli" and asked.key == "process:worker"
    assert (await state_of(engine)).pending == "stop"
    await engine.step()  # the watchdog reads the request: a stop-process effect
    (stop,) = await effects(engine, "stop-process")
    assert stop.data["effect"]["request"] == asked.seq
    assert stop.data["effect"]["reason"] == "stopped by human:cli"
    assert not alive(first)
    for _ in range(3):  # dead, and stopped: never restarted, however long it waits
        clock.advance(120_000)
        await engine.step()
    assert len(await effects(engine, "restart-process")) == 1
    assert (await state_of(engine)).state is SupervisedState.STOPPED

    await request_process(engine.events, "worker", "start", origin="web")
    await engine.step()
    second = await started_pid(engine, reaper)
    assert second != first and alive(second)
    (_, start) = await effects(engine, "restart-process")
    assert start.data["effect"]["reason"] == "started by human:web"
    clock.advance(1_000)
    await engine.step()
    assert (await state_of(engine)).state is SupervisedState.RUNNING


async def test_a_request_only_a_person_may_make_an_agents_is_ignored(
    tmp_path: Path, reaper: list[int], open_engine: Callable[..., Any]
) -> None:
    """A steered agent cannot stop what keeps it alive: it may not label its event as a
    person's (the store refuses), and one under its own origin is not a request."""
    engine: Engine = await open_engine(tmp_path / "home", survival=config(worker(tmp_path)))
    await engine.step()
    running = await started_pid(engine, reaper)
    agent = engine.events.as_principal(Principal.agent("hermes", "hermes-plugin"))
    with pytest.raises(PrincipalRefused):
        await agent.append([request_draft("worker", "stop", origin="cli")])
    own = EventDraft(PROCESS_REQUESTED, "process:worker", {"action": "stop", "name": "worker"},
                     origin="agent:hermes")
    await agent.append([own])
    await engine.step()
    assert await effects(engine, "stop-process") == [] and alive(running)
    assert (await state_of(engine)).pending is None


async def test_restart_replaces_the_running_process_with_a_new_one(
    tmp_path: Path, reaper: list[int], open_engine: Callable[..., Any]
) -> None:
    engine: Engine = await open_engine(tmp_path / "home", survival=config(worker(tmp_path)))
    await engine.step()
    first = await started_pid(engine, reaper)
    await request_process(engine.events, "worker", "restart", origin="cli")
    await engine.step()
    second = await started_pid(engine, reaper)
    assert second != first and alive(second) and not alive(first)
    (acked,) = [e for e in await engine.events.read(kinds=["effect-acked"])
                if e.data["result"].get("stopped")]
    assert acked.data["result"]["stopped"] == first
    assert int((tmp_path / "worker.pid").read_text()) == second


async def test_reset_supervises_a_fatal_process_again_once_its_config_is_fixed(
    tmp_path: Path, reaper: list[int]
) -> None:
    """The watchdog gave up on a crashing process (FATAL); its command is fixed and the
    engine restarted: it stays FATAL until an operator resets it, then it is started again
    with its failed starts and hourly budget counted afresh."""
    home, clock = tmp_path / "home", ManualClock()
    broken = Engine(home, clock=clock, survival=config(worker(tmp_path, CRASHER),
                                                       startretries=1, budget_per_hour=1))
    await broken.open()
    await broken.step()  # never started: started, and it crashes
    await eventually(lambda: not alive(int((tmp_path / "worker.pid").read_text())),
                     what="the crasher to exit")
    clock.advance(5_000)
    await broken.step()  # dead before startsecs: a failed start; one is too many
    clock.advance(5_000)
    await broken.step()
    assert (await state_of(broken)).state is SupervisedState.FATAL
    await broken.close()

    # one restart an hour, spent on the crash: only a reset lets the budget count afresh
    fixed = Engine(home, clock=clock, survival=config(worker(tmp_path), startretries=1,
                                                      budget_per_hour=1))
    await fixed.open()
    try:
        clock.advance(5_000)
        await fixed.step()
        assert (await state_of(fixed)).state is SupervisedState.FATAL  # fixed, still FATAL
        assert len(await effects(fixed, "restart-process")) == 1

        await request_process(fixed.events, "worker", "reset", origin="cli")
        await fixed.step()  # the request is acted on: the record is clean again
        record = await state_of(fixed)
        assert record.given_up_why is None and record.failed_starts == 0
        clock.advance(1_000)
        await fixed.step()  # dead, supervised again: restarted
        pid = await started_pid(fixed, reaper)
        assert alive(pid) and len(await effects(fixed, "restart-process")) == 2
        clock.advance(1_000)
        await fixed.step()
        assert (await state_of(fixed)).state is SupervisedState.RUNNING
    finally:
        await fixed.close()


async def test_a_process_started_by_hand_is_adopted_not_started_twice(
    tmp_path: Path, reaper: list[int], open_engine: Callable[..., Any]
) -> None:
    """No pidfile names it, but its command line is the configured argv: it is the one."""
    spec = worker(tmp_path)
    by_hand = subprocess.Popen(spec.argv)  # noqa: ASYNC220 - returns at once
    reaper.append(by_hand.pid)
    engine: Engine = await open_engine(tmp_path / "home", survival=config(spec))
    await engine.step()
    await engine.step()
    assert await effects(engine, "restart-process") == []
    state = await state_of(engine)
    assert state.state is SupervisedState.RUNNING and state.pid == by_hand.pid


NEGLECTFUL_PARENT = """\
import subprocess, sys
child = subprocess.Popen(sys.argv[1:])
print(child.pid, flush=True)
sys.stdin.readline()  # reaps it only when told
print(child.wait(), flush=True)
"""


async def test_a_stop_ends_when_the_process_exits_even_if_its_parent_never_reaps_it(
    tmp_path: Path, reaper: list[int], open_engine: Callable[..., Any]
) -> None:
    """Started by hand from a program that does not wait for it, the process is a zombie
    once SIGTERM ends it: stopped then, not SIGKILLed after `wait_s`."""
    spec = worker(tmp_path)
    parent = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        [sys.executable, "-c", NEGLECTFUL_PARENT, *spec.argv], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    assert parent.stdin is not None and parent.stdout is not None
    try:
        pid = int(parent.stdout.readline())
        reaper.append(pid)
        engine: Engine = await open_engine(tmp_path / "home", survival=config(spec))
        await engine.step()
        assert (await state_of(engine)).pid == pid  # adopted
        await request_process(engine.events, "worker", "stop", origin="cli")
        await engine.step()
        (stop,) = await effects(engine, "stop-process")
        finished = [e for e in await engine.events.read(key=stop.key)
                    if e.kind in ("effect-acked", "effect-failed")]
        parent.stdin.write("\n")
        parent.stdin.flush()
        code = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
    assert [(e.kind, e.data.get("result")) for e in finished] == [
        ("effect-acked", {"name": "worker", "pid": pid, "signal": "SIGTERM"})]
    assert code == -15  # SIGTERM ended it, never SIGKILL


async def test_a_process_whose_main_thread_ended_while_another_runs_has_not_stopped(
    tmp_path: Path, reaper: list[int]
) -> None:
    """Linux shows it as a zombie, yet it runs (and holds what it held): a stop waits for
    it, then SIGKILLs it."""
    from pulse_survival.effects import StopProcess
    from pulse_survival.executors import RestartProcessExecutor

    spec = Essential(name="worker", argv=(sys.executable, "-c", MAIN_THREAD_LEAVES,
                                          "on-sigterm", str(tmp_path)),
                     pidfile=str(tmp_path / "worker.pid"))
    child = subprocess.Popen(spec.argv, stdout=subprocess.PIPE)  # noqa: ASYNC220
    reaper.append(child.pid)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    (tmp_path / "worker.pid").write_text(f"{child.pid}\n")
    events = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        ctx = ExecutionContext(effect_id="e", attempt=1, seq=1, origin="rule:test",
                               clock=ManualClock(), events=events)
        executor = RestartProcessExecutor(tmp_path / "logs", (spec,))
        result = await executor.execute(StopProcess(name="worker", wait_s=1.0), ctx)
    finally:
        await events.close()
    assert result == {"name": "worker", "pid": child.pid, "signal": "SIGKILL"}
    assert not alive(child.pid)


async def test_a_restart_finding_the_process_already_running_adopts_it(
    tmp_path: Path, reaper: list[int]
) -> None:
    from pulse_survival.effects import RestartProcess
    from pulse_survival.executors import RestartProcessExecutor

    spec = worker(tmp_path)
    by_hand = subprocess.Popen(spec.argv)  # noqa: ASYNC220 - returns at once
    reaper.append(by_hand.pid)
    executor = RestartProcessExecutor(tmp_path / "logs", (spec,))
    effect = RestartProcess(name="worker", argv=spec.argv, pidfile=spec.pidfile)
    assert executor._spawn(effect) == {"name": "worker", "pid": by_hand.pid, "adopted": True}
    assert len([p for p in psutil.process_iter(["cmdline"])
                if p.info["cmdline"] == list(spec.argv)]) == 1


def states(**by_name: SupervisedState) -> list[ProcessState]:
    return [ProcessState(name=name, state=state, at=0, pid=7 if state.value == "RUNNING"
                         else None) for name, state in by_name.items()]


def test_a_request_about_an_unknown_process_names_the_known_ones() -> None:
    with pytest.raises(UnknownProcess, match=r"no essential process named 'wrker': known: "
                                             r"worker, gateway \(`upulse process list`"):
        check_request(states(worker=SupervisedState.FATAL, gateway=SupervisedState.RUNNING),
                      "wrker", "reset", ("worker", "gateway"))


@pytest.mark.parametrize(("state", "action", "says"), [
    (SupervisedState.RUNNING, "reset", "worker is RUNNING, not FATAL"),
    (SupervisedState.BACKOFF, "reset", "worker is BACKOFF, not FATAL"),
    (SupervisedState.RUNNING, "start", r"worker is already RUNNING \(pid 7\)"),
    (SupervisedState.STOPPED, "stop", "worker is already STOPPED"),
])
def test_a_request_that_makes_no_sense_in_the_state_is_refused(
    state: SupervisedState, action: str, says: str
) -> None:
    with pytest.raises(ProcessRequestRefused, match=says):
        check_request(states(worker=state), "worker", action, ("worker",))


def test_a_process_pulse_cannot_start_may_only_be_stopped() -> None:
    with pytest.raises(ProcessRequestRefused, match="worker has no argv"):
        check_request(states(worker=SupervisedState.EXITED), "worker", "start", ())
    found = check_request(states(worker=SupervisedState.RUNNING), "worker", "stop", ())
    assert found.name == "worker"
    assert check_request(states(worker=SupervisedState.FATAL), "worker", "reset",
                         ("worker",)).state is SupervisedState.FATAL
