"""`upulse process list|start|stop|restart|reset|log` against a real daemon and real
essential processes: each control is a request the daemon's survival layer acts on."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pulse_cli.instances import process_note
from pulse_survival import ProcessState, SupervisedState
from tests.cli.runner import Upulse, wait_until
from tests.cli.support import configure
from tests.processes import alive

TEST_TIME_LIMIT_S = 120
WORKER = "import os, time; print('hello from', os.getpid(), flush=True); time.sleep(300)"
CRASHER = "raise SystemExit(3)"


@pytest.fixture
def started(upulse: Upulse) -> Iterator[list[int]]:
    """Pids of essential processes to kill once the daemons are stopped."""
    pids: list[int] = []
    yield pids
    upulse.stop_all()  # first, or a daemon restarts what is killed
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def supervise(home: Path, code: str, **policy: Any) -> list[str]:
    """Make `worker` (started with `code`, found by its pidfile) the home's one essential
    process; its argv."""
    argv = [sys.executable, "-c", code, str(home)]  # a command line of this test's own
    process: dict[str, Any] = {"startsecs": 0.5, **policy}
    configure(home, survival={"processes": [{"name": "worker", "argv": argv,
                                             "pidfile": str(home / "worker.pid")}],
                              "process": process})
    return argv


def listed(upulse: Upulse, home: Path) -> dict[str, Any]:
    report = upulse.json("process", "list", "--home", home)
    assert isinstance(report, dict)
    (worker,) = report["processes"]
    assert isinstance(worker, dict)
    return worker


def status(home: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        found: dict[str, Any] = json.loads((home / "daemon.status.json").read_text())
        return found
    return {}


def running_pid(upulse: Upulse, home: Path, started: list[int]) -> int:
    """The worker's pid once the daemon reports it RUNNING."""
    seen = wait_until(lambda: listed(upulse, home)["state"] == "RUNNING" and
                      listed(upulse, home)["pid"], 30, "the worker to be RUNNING")
    assert isinstance(seen, int)
    started.append(seen)
    return seen


def test_stop_start_restart_from_the_shell_through_the_running_daemon(
        upulse: Upulse, tmp_path: Path, started: list[int]) -> None:
    home = upulse.init(tmp_path / "home")
    supervise(home, WORKER)
    upulse("daemon", "start", "--home", home)
    first = running_pid(upulse, home, started)
    wait_until(lambda: f"hello from {first}" in upulse("process", "log", "worker", "--home",
                                                        home).stdout, 20, "its first line")

    stopped = upulse("process", "stop", "worker", "--home", home, "--reason", "new disk")
    assert f"worker stopped (pid {first}, SIGTERM)" in stopped.stdout
    assert "stays stopped until `upulse process start worker`" in stopped.stdout
    assert not alive(first)
    wait_until(lambda: (status(home).get("processes") or [{}])[0].get("state") == "STOPPED",
               20, "the daemon to report it STOPPED")
    ticks = status(home)["ticks"]
    wait_until(lambda: status(home)["ticks"] >= ticks + 10, 30, "ten more ticks")
    assert listed(upulse, home)["state"] == "STOPPED"  # dead and sampled: never restarted
    assert "stopped by an operator; `upulse process start` starts it" in \
        upulse("process", "list", "--home", home).stdout

    start = upulse("process", "start", "worker", "--home", home)
    second = running_pid(upulse, home, started)
    assert f"worker started: pid {second} started" in start.stdout and second != first

    restart = upulse.json("process", "restart", "worker", "--home", home)
    assert isinstance(restart, dict)
    assert restart["was"] == "RUNNING" and restart["outcome"]["status"] == "acked"
    third = restart["outcome"]["result"]["pid"]
    started.append(third)
    assert restart["outcome"]["result"]["stopped"] == second and not alive(second)
    assert alive(third)

    events = upulse.json("events", "--kind", "process-requested", "--home", home)
    assert isinstance(events, list)
    assert [(e["data"]["action"], e["origin"]) for e in events] == [
        ("stop", "human:cli"), ("start", "human:cli"), ("restart", "human:cli")]
    assert events[0]["data"]["reason"] == "new disk"
    log = (home / "daemon.log").read_text()
    assert "stop worker asked by human:cli: new disk" in log
    assert "restarting worker: started by human:cli" in log


def test_a_fatal_process_stays_fatal_after_its_fix_until_it_is_reset(
        upulse: Upulse, tmp_path: Path, started: list[int]) -> None:
    home = upulse.init(tmp_path / "home")
    supervise(home, CRASHER, startretries=1, backoff_initial_s=0.5)
    upulse("daemon", "start", "--home", home)
    wait_until(lambda: listed(upulse, home)["state"] == "FATAL", 30, "the crasher to be FATAL")
    refused = upulse("process", "start", "nope", "--home", home, ok=False)
    assert refused.returncode == 1
    assert "no essential process named 'nope': known: worker" in refused.stderr

    supervise(home, WORKER, startretries=1)  # the fix
    upulse("daemon", "restart", "--home", home)
    wait_until(lambda: status(home).get("ticks", 0) > 5, 30, "the new daemon to tick")
    assert listed(upulse, home)["state"] == "FATAL"

    reset = upulse("process", "reset", "worker", "--home", home)
    assert "worker reset" in reset.stdout and "supervised again" in reset.stdout
    running_pid(upulse, home, started)
    again = upulse("process", "reset", "worker", "--home", home, ok=False)
    assert again.returncode == 1
    assert "worker is RUNNING, not FATAL" in again.stderr


def test_without_a_daemon_a_control_is_refused_and_nothing_is_written(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    supervise(home, WORKER)
    refused = upulse("process", "stop", "worker", "--home", home, ok=False)
    assert refused.returncode == 3
    assert "no daemon is running" in refused.stderr and "upulse daemon start" in refused.stderr
    assert upulse.json("events", "--kind", "process-requested", "--home", home) == []
    text = upulse("process", "list", "--home", home).stdout
    assert "worker" in text and "UNKNOWN" in text and "no daemon runs in" in text
    configure(home, layers={"no-such-layer": {}})  # its essentials cannot be known here
    listing = upulse("process", "list", "--home", home)
    assert "worker" in listing.stdout and "no-such-layer" in listing.stderr
    assert "essential processes of the configured layers are not listed" in listing.stderr


def test_log_tails_the_configured_log_and_says_when_there_is_none(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    supervise(home, WORKER)
    missing = upulse("process", "log", "worker", "--home", home, ok=False)
    assert missing.returncode == 1
    assert f"worker's output log {home / 'logs' / 'worker.log'} does not exist yet" \
        in missing.stderr
    (home / "logs").mkdir(exist_ok=True)
    (home / "logs" / "worker.log").write_text("".join(f"line {n}\n" for n in range(100)))
    assert upulse("process", "log", "worker", "-n", "2", "--home", home).stdout == \
        "line 98\nline 99\n"
    assert upulse.json("process", "log", "worker", "--home", home) == [
        f"line {n}" for n in range(50, 100)]
    configure(home, survival={"processes": [{"name": "gw", "match_name": "gw"}]})
    none = upulse("process", "log", "gw", "--home", home, ok=False)
    assert "gw has no output log: no `log` is configured and pulse does not start it" \
        in none.stderr


def test_the_note_says_a_request_not_yet_acted_on_and_who_asked() -> None:
    waiting = ProcessState(name="worker", state=SupervisedState.RUNNING, at=0,
                           pending="restart", asked_by="human:web")
    assert process_note(waiting, 0) == "restart asked by human:web"
