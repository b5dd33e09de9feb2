"""`upulse daemon status` and `instances` when no daemon runs: one killed without stopping,
or a home held by an embedded engine (issue 26, item 8)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.cli.runner import ROOT, Upulse, daemon_pid, wait_until

EMBEDDED = textwrap.dedent("""
    import asyncio, sys
    from pulse_core import Engine

    async def main() -> None:
        engine = Engine(sys.argv[1])
        await engine.open()
        print("open", flush=True)
        try:
            sys.stdin.read()  # until the test closes our stdin
        finally:
            await engine.close()

    asyncio.run(main())
""")

# What the daemon does with its pidfile, alone: written and held locked, engine.lock not
# held, as between the two engines of a reload.
PIDFILE_HOLDER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from pulse_cli.home import Home

    held = Home(Path(sys.argv[1])).write_pidfile(os.getpid())
    print("held", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    held.close()
""")


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A home whose engine.lock an embedded `Engine` in another process holds: its path
    and that process's pid."""
    home = tmp_path / "embedded"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen([sys.executable, "-c", EMBEDDED, str(home)], env=env, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as engine:
        assert engine.stdout is not None and engine.stdin is not None
        assert engine.stdout.readline().strip() == "open"
        try:
            yield home, engine.pid
        finally:
            engine.stdin.close()
            engine.wait(timeout=30)


def test_a_daemon_killed_without_stopping_is_said_to_have_died_with_its_pid(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("daemon", "start", "--home", home)
    pid = daemon_pid(home)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not psutil.pid_exists(pid) or
               psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10, "the daemon to die")

    shown = upulse("daemon", "status", "--home", home, ok=False)
    assert shown.returncode == 3
    assert f"not running: the daemon (pid {pid}) died without stopping — its last status at" \
        in shown.stdout
    assert "last stop -" not in shown.stdout
    assert f"it (pid {pid}) died without stopping" in shown.stderr
    report = json.loads(upulse("daemon", "status", "--home", home, "--json", ok=False).stdout)
    assert report["died"] is True and report["running"] is False
    listed = json.loads(upulse("instances", "--home", home, "--json").stdout)
    assert {"name": "default", "state": "died", "pid": pid, "home": str(home)} in listed


def test_a_daemon_that_stopped_is_not_said_to_have_died(upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("daemon", "start", "--home", home)
    upulse("daemon", "stop", "--home", home)
    shown = upulse("daemon", "status", "--home", home, ok=False)
    assert "stopped (last stop " in shown.stdout and "died" not in shown.stdout
    report = json.loads(upulse("daemon", "status", "--home", home, "--json", ok=False).stdout)
    assert report["died"] is False and report["embedded_engine_pid"] is None


def test_a_home_held_by_an_embedded_engine_says_so_instead_of_stopped(
        upulse: Upulse, embedded: tuple[Path, int]) -> None:
    home, pid = embedded
    shown = upulse("daemon", "status", "--home", home, ok=False)
    assert shown.returncode == 3
    assert f"no daemon: an embedded engine (pid {pid}) runs in this home" in shown.stdout
    assert "stopped" not in shown.stdout
    assert f"an embedded engine (pid {pid}) holds the home" in shown.stderr
    report = json.loads(upulse("daemon", "status", "--home", home, "--json", ok=False).stdout)
    assert report["embedded_engine_pid"] == pid and report["running"] is False
    listed = json.loads(upulse("instances", "--home", home, "--json").stdout)
    assert listed[0]["state"] == "embedded engine" and listed[0]["pid"] == pid


def test_an_embedded_engine_that_closed_leaves_no_holder(upulse: Upulse, tmp_path: Path) -> None:
    """engine.lock keeps the pid of the engine that last held it; once that engine closed,
    a live process of that pid holds no lock, and nothing claims the home."""
    home = tmp_path / "closed"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen([sys.executable, "-c", EMBEDDED, str(home)], env=env, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as engine:
        assert engine.stdout is not None and engine.stdin is not None
        assert engine.stdout.readline().strip() == "open"
        lock = (home / "engine.lock").read_text()
        engine.stdin.close()
        engine.wait(timeout=30)
    (home / "engine.lock").write_text(str(os.getpid()))  # a live pid that holds no lock
    assert lock.strip() == str(engine.pid)
    report = json.loads(upulse("daemon", "status", "--home", home, "--json", ok=False).stdout)
    assert report["embedded_engine_pid"] is None


def clock_stepped_forward(*files: Path, by_s: float = 3600.0) -> None:
    """Make `files` look written `by_s` before they were, as they look after the wall clock
    stepped forward by that much since (psutil's process starts move with the step; a file's
    time does not): an NTP correction, a VM resumed, a laptop woken."""
    for path in files:
        info = path.stat()
        os.utime(path, (info.st_atime - by_s, info.st_mtime - by_s))


def test_a_running_daemon_is_still_running_after_the_wall_clock_stepped_forward(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("daemon", "start", "--home", home)
    pid = daemon_pid(home)
    assert pid is not None
    clock_stepped_forward(home / "daemon.pid", home / "engine.lock")
    report = json.loads(upulse("daemon", "status", "--home", home, "--json").stdout)
    assert report["running"] is True and report["pid"] == pid
    refused = upulse("daemon", "start", "--home", home, ok=False)
    assert refused.returncode == 3 and f"already running (pid {pid})" in refused.stderr
    upulse("daemon", "stop", "--home", home)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def lock_holders(path: Path) -> set[int]:
    """The pids /proc/locks lists a lock of on the file `path`."""
    inode = str(path.stat().st_ino)
    return {int(fields[4]) for fields in map(str.split, Path("/proc/locks").read_text()
                                               .splitlines())
            if len(fields) > 5 and fields[5].rsplit(":", 1)[-1] == inode}


def test_the_daemon_holds_its_pidfile_locked_for_its_life_reloads_included(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("daemon", "start", "--home", home)
    pid = daemon_pid(home)
    assert pid is not None and pid in lock_holders(home / "daemon.pid")
    os.kill(pid, signal.SIGHUP)
    wait_until(lambda: "SIGHUP: reloaded" in (home / "daemon.log").read_text(), 60,
               "the daemon to reload")
    assert daemon_pid(home) == pid and pid in lock_holders(home / "daemon.pid")
    upulse("daemon", "stop", "--home", home)
    assert not (home / "daemon.pid").exists()


def test_a_daemon_between_the_engines_of_a_reload_is_running_after_the_clock_stepped(
        upulse: Upulse, tmp_path: Path) -> None:
    """While a reload has closed one engine and not yet opened the next, nobody holds
    engine.lock: the daemon is known by the lock on its pidfile, with no clock read."""
    home = upulse.init(tmp_path / "home")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen([sys.executable, "-c", PIDFILE_HOLDER, str(home)], env=env,
                          text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as daemon:
        assert daemon.stdout is not None and daemon.stdin is not None
        try:
            assert daemon.stdout.readline().strip() == "held"
            clock_stepped_forward(home / "daemon.pid")
            report = json.loads(upulse("daemon", "status", "--home", home, "--json",
                                       ok=False).stdout)
            assert report["running"] is True and report["pid"] == daemon.pid
            refused = upulse("daemon", "start", "--home", home, ok=False)
            assert refused.returncode == 3
            assert f"already running (pid {daemon.pid})" in refused.stderr
        finally:
            daemon.stdin.close()
            daemon.wait(timeout=30)


def test_an_embedded_engine_is_found_after_the_wall_clock_stepped_forward(
        upulse: Upulse, embedded: tuple[Path, int]) -> None:
    home, pid = embedded
    clock_stepped_forward(home / "engine.lock")
    report = json.loads(upulse("daemon", "status", "--home", home, "--json", ok=False).stdout)
    assert report["embedded_engine_pid"] == pid


def test_start_stop_restart_and_logs_print_one_json_document_with_json(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    started = upulse.json("daemon", "start", "--home", home)
    first = daemon_pid(home)
    assert started == {"home": str(home), "pid": first}
    restarted = upulse.json("daemon", "restart", "--home", home)
    second = daemon_pid(home)
    assert restarted == {"home": str(home), "stopped_pid": first, "pid": second}
    assert second != first
    lines = upulse.json("daemon", "logs", "--home", home, "-n", "1000")
    assert isinstance(lines, list) and all(isinstance(line, str) for line in lines)
    assert lines == (home / "daemon.log").read_text().splitlines()[:len(lines)]
    assert any(f"upulse[{second}]: ready" in line for line in lines)
    assert len(upulse.json("daemon", "logs", "--home", home, "-n", "2")) == 2  # type: ignore[arg-type]
    stopped = upulse.json("daemon", "stop", "--home", home)
    assert stopped == {"home": str(home), "stopped_pid": second}
    assert upulse.json("daemon", "logs", "--home", tmp_path / "never") == []


def test_json_and_foreground_together_are_refused_saying_why(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    refused = upulse("daemon", "start", "--foreground", "--json", "--home", home, ok=False)
    assert refused.returncode == 2
    assert "--json and --foreground do not go together" in refused.stderr
    assert daemon_pid(home) is None


def test_a_loop_that_ended_by_design_is_not_listed_among_the_loops_not_running(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A one-shot service (an agent layer's program check) returns: its loop is EXITED,
    which is done, not trouble; a loop in backoff is listed."""
    from pulse_cli.home import DaemonStatus
    from pulse_cli.instances import _print_supervised
    from pulse_core import LoopState, LoopStatus

    last = DaemonStatus(pid=1, state="running", started_at=0, updated_at=0, instance="x",
                        loops=[LoopStatus("service:cursor-program", LoopState.EXITED),
                               LoopStatus("tick", LoopState.BACKOFF, restarts=1,
                                          last_error="RuntimeError: boom")])
    _print_supervised([], last, 0, running=True)
    shown = capsys.readouterr().out
    assert "engine loops not running" in shown and "tick" in shown and "BACKOFF" in shown
    assert "cursor-program" not in shown and "EXITED" not in shown
