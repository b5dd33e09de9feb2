"""process_watchdog and llm_watchdog with real processes: kill, restart, give up."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from pulse_core import Engine, Layer, LayerError, ManualClock
from pulse_survival import (
    Essential,
    LlmPolicy,
    ProcessPolicy,
    SurvivalConfig,
    SurvivalLedger,
)
from pulse_survival.watchers import ProcessAliveWatcher, find_process
from tests.processes import MAIN_THREAD_LEAVES
from tests.processes import exited as exited_pid
from tests.timing import eventually

SLEEPER = "import time; time.sleep(120)"
CRASHER = "raise SystemExit(3)"


def pid_in(pidfile: Path) -> int:
    return int(pidfile.read_text().split()[0])


def exited(pidfile: Path) -> bool:
    """Whether the process the pidfile names (if any) has exited: gone, or a zombie."""
    return not pidfile.exists() or exited_pid(pid_in(pidfile))


async def notices(engine: Engine, topic: str) -> list[str]:
    return [e.data["effect"]["level"] for e in await engine.events.read(kinds=["effect"])
            if e.data["effect"]["type"] == "notify" and e.data["effect"]["topic"] == topic]


async def test_an_essential_process_killed_with_sigkill_is_restarted(
    tmp_path: Path, reaper: list[int]
) -> None:
    pidfile = tmp_path / "worker.pid"
    first = subprocess.Popen([sys.executable, "-c", SLEEPER])  # noqa: ASYNC220 - returns at once
    reaper.append(first.pid)
    pidfile.write_text(str(first.pid))
    spec = Essential(name="worker", argv=(sys.executable, "-c", SLEEPER, str(tmp_path)),
                     pidfile=str(pidfile), log=str(tmp_path / "worker.log"))
    engine = Engine(tmp_path / "home", survival=SurvivalConfig(processes=(spec,)))
    await engine.open()
    await engine.step()
    assert await engine.events.read(kinds=["effect"]) == []
    first.send_signal(signal.SIGKILL)
    first.wait(5)
    await engine.step()
    (restart,) = [e for e in await engine.events.read(kinds=["effect-acked"])]
    new_pid = restart.data["result"]["pid"]
    reaper.append(new_pid)
    assert new_pid != first.pid and pid_in(pidfile) == new_pid
    assert psutil.Process(new_pid).is_running()
    await engine.step()
    (sample,) = (await engine.snapshot()).vitals["process-alive"].sample.data.values()
    assert sample["alive"] and sample["pid"] == new_pid and sample["restarts_seen"] == 1
    assert len(await engine.events.read(kinds=["effect"])) == 1
    await engine.close()


async def test_a_process_another_layer_declares_essential_is_kept_alive_by_survival(
    tmp_path: Path, reaper: list[int]
) -> None:
    pidfile = tmp_path / "gateway.pid"
    spec = Essential(name="gateway", argv=(sys.executable, "-c", SLEEPER, str(tmp_path)),
                     pidfile=str(pidfile), log=str(tmp_path / "gateway.log"))
    engine = Engine(tmp_path / "home", layers=[Layer("agent-host", essentials=(spec,))])
    await engine.open()
    try:
        await engine.step()  # never started: the watchdog starts it
        (started,) = await engine.events.read(kinds=["effect-acked"])
        pid = started.data["result"]["pid"]
        reaper.append(pid)
        assert pid_in(pidfile) == pid and psutil.Process(pid).is_running()
        watchdog = next(r for r in engine.survival.rules if type(r).__name__ == "ProcessWatchdog")
        assert [p.name for p in watchdog.processes] == ["gateway"]
    finally:
        await engine.close()


async def test_a_restart_takes_its_env_from_the_config_and_never_writes_the_values_to_the_log(
    tmp_path: Path, reaper: list[int]
) -> None:
    pidfile, out = tmp_path / "bot.pid", tmp_path / "bot.out"
    code = (f"import os, time; open({str(out)!r}, 'w').write(os.environ['BOT_TOKEN']); "
            "time.sleep(120)")
    spec = Essential(name="bot", argv=(sys.executable, "-c", code), pidfile=str(pidfile),
                     env={"BOT_TOKEN": "s3cr3t-value"}, log=str(tmp_path / "bot.log"))
    engine = Engine(tmp_path / "home", layers=[Layer("agent-host", essentials=(spec,))])
    await engine.open()
    try:
        await engine.step()
        (acked,) = await engine.events.read(kinds=["effect-acked"])
        reaper.append(acked.data["result"]["pid"])
        for _ in range(100):
            if out.exists() and out.read_text():
                break
            await asyncio.sleep(0.05)
        assert out.read_text() == "s3cr3t-value"
        (restart,) = await engine.events.read(kinds=["effect"])
        assert restart.data["effect"]["env_names"] == ["BOT_TOKEN"]
    finally:
        await engine.close()
    assert b"s3cr3t-value" not in (tmp_path / "home" / "events.db").read_bytes()


async def test_a_process_just_started_is_seen_up_only_as_long_as_it_has_run(
    tmp_path: Path, reaper: list[int]
) -> None:
    # psutil's start time is the boot time in whole seconds plus the start since boot: read
    # against the wall clock it made a process up to 1 s older, enough to judge one that
    # dies at once as having stayed up startsecs
    argv = (sys.executable, "-c", SLEEPER, str(tmp_path))
    started = time.monotonic()
    child = subprocess.Popen(argv)  # noqa: ASYNC220 - returns at once
    reaper.append(child.pid)
    pidfile = tmp_path / "w.pid"
    pidfile.write_text(f"{child.pid}\n")
    sample = await ProcessAliveWatcher([Essential(name="w", argv=argv,
                                                  pidfile=str(pidfile))]).collect()
    lived = time.monotonic() - started
    assert sample["w"]["alive"] and sample["w"]["pid"] == child.pid
    assert sample["w"]["uptime_s"] <= lived + 0.02  # the kernel counts starts in 10 ms ticks


def test_a_layer_essential_named_like_a_survival_process_is_refused(tmp_path: Path) -> None:
    spec = Essential(name="bot", match_cmdline="bot --serve")
    with pytest.raises(LayerError, match=r"SurvivalConfigError: .* repeated: bot"):
        Engine(tmp_path / "home", survival=SurvivalConfig(processes=(spec,)),
               layers=[Layer("agent-host", essentials=(spec,))])


def test_an_essential_with_no_way_to_find_it_is_refused_where_it_is_built() -> None:
    with pytest.raises(LayerError, match="essential process 'gw' has no way to find"):
        Essential(name="gw", argv=("gw",))


def test_a_process_found_by_its_argv_or_command_line_must_have_the_match_env(
        tmp_path: Path) -> None:
    """Two workers of one command line, for two homes: each spec finds its own by the
    environment, by argv as by match_cmdline; the pidfile's process is asked nothing."""
    code = "import sys; print('up', flush=True); sys.stdin.read()"
    argv = (sys.executable, "-c", code, f"worker-{tmp_path.name}")
    workers = []
    for home in ("a", "b"):
        worker = subprocess.Popen(argv, env={**os.environ, "WORKER_HOME": home}, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert worker.stdout is not None and worker.stdout.readline().strip() == "up"
        workers.append(worker)
    try:
        for worker, home in zip(workers, ("a", "b"), strict=True):
            by_argv = Essential(name="w", pidfile=str(tmp_path / "absent.pid"), argv=argv,
                                match_env={"WORKER_HOME": home})
            by_cmdline = Essential(name="w", match_cmdline=argv[-1],
                                   match_env={"WORKER_HOME": home})
            for spec in (by_argv, by_cmdline):
                found = find_process(spec)
                assert found is not None and found.pid == worker.pid
        elsewhere = {"WORKER_HOME": "c"}
        assert find_process(Essential(name="w", match_cmdline=argv[-1], argv=argv,
                                      match_env=elsewhere)) is None
        pidfile = tmp_path / "w.pid"
        pidfile.write_text(f"{workers[1].pid}\n")
        found = find_process(Essential(name="w", pidfile=str(pidfile), match_env=elsewhere))
        assert found is not None and found.pid == workers[1].pid
    finally:
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.close()
            worker.wait(timeout=30)


async def test_a_process_whose_main_thread_ended_while_another_runs_is_alive(
    tmp_path: Path, reaper: list[int]
) -> None:
    """Linux shows it as a zombie; the watcher does not take it for dead (and so never
    starts a second one beside it), until it is."""
    pidfile = tmp_path / "w.pid"
    spec = Essential(name="w", pidfile=str(pidfile))
    child = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        [sys.executable, "-c", MAIN_THREAD_LEAVES, "now", str(tmp_path)],
        stdout=subprocess.PIPE)
    reaper.append(child.pid)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    pidfile.write_text(f"{child.pid}\n")
    await eventually(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE,
                     what="its main thread to end")
    seen = find_process(spec)
    assert seen is not None and seen.pid == child.pid
    child.kill()
    child.wait(timeout=30)
    assert find_process(spec) is None


@pytest.mark.parametrize(("policy", "why"), [
    (ProcessPolicy(startretries=3, budget_per_hour=50, backoff_initial_s=1), "3 failed starts"),
    (ProcessPolicy(startretries=20, budget_per_hour=2, backoff_initial_s=1),
     "2 restarts in the last hour"),
])
async def test_a_process_that_keeps_dying_is_given_up_with_one_notice(
    tmp_path: Path, policy: ProcessPolicy, why: str
) -> None:
    pidfile = tmp_path / "crasher.pid"
    spec = Essential(name="crasher", argv=(sys.executable, "-c", CRASHER, str(tmp_path)),
                     pidfile=str(pidfile))
    clock = ManualClock()
    engine = Engine(tmp_path / "home", clock=clock,
                    survival=SurvivalConfig(processes=(spec,), process=policy))
    await engine.open()
    for _ in range(12):
        await engine.step()
        await eventually(lambda: exited(pidfile), what="the crasher's exit")
        clock.advance(70_000)
    restarts = [e for e in await engine.events.read(kinds=["effect"])
                if e.data["effect"]["type"] == "restart-process"]
    expected = 3 if policy.startretries == 3 else 2
    assert len(restarts) == expected
    assert await notices(engine, "process:crasher") == ["given-up"]
    (given_up,) = [e.data["effect"]["text"] for e in await engine.events.read(kinds=["effect"])
                   if e.data["effect"]["type"] == "notify"]
    assert why in given_up
    (notification,) = await engine.events.read(kinds=["notification"])
    assert notification.key == "process:crasher"
    await engine.close()


async def test_restarts_back_off_exponentially(tmp_path: Path) -> None:
    spec = Essential(name="crasher", argv=(sys.executable, "-c", CRASHER, str(tmp_path)),
                     pidfile=str(tmp_path / "c.pid"))
    clock = ManualClock()
    engine = Engine(tmp_path / "home", clock=clock, survival=SurvivalConfig(
        processes=(spec,), process=ProcessPolicy(startretries=10, budget_per_hour=50,
                                                 backoff_initial_s=1, backoff_max_s=8)))
    await engine.open()
    times: list[int] = []
    for _ in range(40):
        await engine.step()
        await eventually(lambda: exited(tmp_path / "c.pid"), what="the crasher's exit")
        clock.advance(500)
    for event in await engine.events.read(kinds=["effect"]):
        times.append(event.ts)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) >= 4
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]
    assert all(g <= 8_000 + 1_000 for g in gaps)
    await engine.close()


async def test_llm_watchdog_restarts_the_proxy_after_k_failed_probes(
    tmp_path: Path, reaper: list[int]
) -> None:
    proxy = Essential(name="llm-proxy", argv=(sys.executable, "-c", SLEEPER, str(tmp_path)),
                      pidfile=str(tmp_path / "proxy.pid"))
    clock = ManualClock()
    engine = Engine(tmp_path / "home", clock=clock, survival=SurvivalConfig(
        llm=LlmPolicy(failures=3, restart=proxy, backoff_initial_s=10)))
    await engine.open()

    async def probe(ok: bool) -> list[Any]:
        clock.advance(1_000)
        await engine.vitals.record("llm-route", {"ok": ok})
        await engine.tick()
        await engine.executor_loop.run_until_idle()
        return [e for e in await engine.events.read(kinds=["effect-acked"])]

    assert await probe(False) == [] and await probe(False) == []
    acked = await probe(False)
    assert len(acked) == 1
    reaper.append(acked[0].data["result"]["pid"])
    for _ in range(3):
        acked = await probe(False)  # still inside the 10 s backoff
    assert len(acked) == 1
    clock.advance(10_000)
    acked = await probe(False)
    assert len(acked) == 2
    reaper.append(acked[1].data["result"]["pid"])
    # the proxy was running (hung, say): the restart replaced it, never adopted it
    first, second = (e.data["result"] for e in acked)
    assert second["stopped"] == first["pid"] != second["pid"]
    assert not psutil.pid_exists(first["pid"]) or \
        psutil.Process(first["pid"]).status() == psutil.STATUS_ZOMBIE
    await engine.close()


async def test_a_good_run_resets_the_failed_starts_so_one_crash_after_it_is_restarted(
    tmp_path: Path,
) -> None:
    """A restart seen up `startsecs` clears the failed starts (supervisord's RUNNING): with
    startretries=2, a failed start, a good run and then one failed start again is one
    failure in a row, not two, so the watchdog keeps restarting. The process-alive samples
    are recorded by hand, and the restarts are decided but not run."""
    clock = ManualClock()
    spec = Essential(name="w", argv=(sys.executable, "-c", SLEEPER, str(tmp_path)),
                     match_name="no-such-w")
    engine = Engine(tmp_path / "home", clock=clock, survival=SurvivalConfig(
        processes=(spec,), process=ProcessPolicy(startsecs=1, startretries=2,
                                                 budget_per_hour=50, backoff_initial_s=1)))
    await engine.open()

    async def seen(after_ms: int, alive: bool, uptime_s: float = 0.0) -> None:
        clock.advance(after_ms)
        await engine.vitals.record("process-alive", {"w": {
            "alive": alive, "pid": 4242 if alive else None, "uptime_s": uptime_s,
            "restarts_seen": 0}})
        await engine.tick()

    try:
        await seen(0, False)            # dead: restart 1
        await seen(100, False)          # restart 1 failed (1 in a row)
        await seen(2_000, False)        # after the backoff: restart 2
        await seen(100, True, 5.0)      # restart 2 held: back to 0 in a row
        await seen(1_000, False)        # a crash after the good run: restart 3
        await seen(100, False)          # restart 3 failed: 1 in a row, not 2
        await seen(2_000, False)        # so, after the backoff: restart 4
        tags = [e.data["mark"]["type"] if e.kind == "mark" else e.data["effect"]["type"]
                for e in await engine.events.read(kinds=["mark", "effect"])]
        ledger = (await engine.snapshot()).state(SurvivalLedger)
    finally:
        await engine.close()
    assert "process-gave-up" not in tags
    assert tags.count("restart-process") == 4
    assert tags.count("process-start-held") == 1
    assert ledger.process("w").failed_starts == 1
