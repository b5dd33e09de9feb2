"""What an operator sees of a running daemon: daemon.log saying why (restarts, give-ups,
rollbacks, notices, reloads, loop restarts), its JSON lines, `daemon status` with the
essential processes as supervisorctl shows them, and systemd's notify protocol; with real
daemons, real essential processes and a real unix datagram socket."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pulse_cli.daemon_log import DaemonLog, LogRecords
from pulse_cli.sd_notify import SystemdNotifier
from tests.cli.runner import Upulse, daemon_pid, wait_until
from tests.cli.support import configure, git

TEST_TIME_LIMIT_S = 90
SLEEPER = "import time; time.sleep(300)"
CRASHER = "raise SystemExit(3)"


@pytest.fixture
def pidfiles(upulse: Upulse) -> Iterator[list[Path]]:
    """Pidfiles of essential processes: once the daemons are stopped, each process named in
    one is killed."""
    files: list[Path] = []
    yield files
    upulse.stop_all()  # first, or a daemon restarts what is killed
    for path in files:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(path.read_text().split()[0]), signal.SIGKILL)


def essential(home: Path, pidfiles: list[Path], code: str, name: str, **policy: Any
              ) -> Path:
    """Make `name` (restarted with `code`, found by its pidfile) the home's one essential
    process, with the process policy `policy`; returns its pidfile."""
    pidfile = home.parent / f"{name}.pid"
    pidfiles.append(pidfile)
    configure(home, survival={
        "processes": [{"name": name, "argv": [sys.executable, "-c", code, str(home)],
                       "pidfile": str(pidfile)}],
        "process": policy})
    return pidfile


def status_file(home: Path) -> dict[str, Any]:
    """daemon.status.json as the daemon last wrote it ({} before it wrote one)."""
    with contextlib.suppress(OSError, ValueError):
        status: dict[str, Any] = json.loads((home / "daemon.status.json").read_text())
        return status
    return {}


def process_in(home: Path, name: str) -> dict[str, Any] | None:
    """Process `name` as the daemon last reported it."""
    return next((p for p in status_file(home).get("processes", []) if p["name"] == name), None)


def log_text(home: Path) -> str:
    return (home / "daemon.log").read_text()


def status_line(text: str, key: str) -> str:
    """The line of `daemon status`'s output that starts with `key`."""
    return next(line for line in text.splitlines() if line.startswith(f"{key} "))


def test_a_killed_essential_process_is_told_in_daemon_log_and_status_shows_its_restart(
        upulse: Upulse, tmp_path: Path, pidfiles: list[Path]) -> None:
    home = upulse.init(tmp_path / "home")
    pidfile = essential(home, pidfiles, SLEEPER, "worker", startsecs=3, backoff_initial_s=1)
    first = subprocess.Popen([sys.executable, "-c", SLEEPER])
    pidfile.write_text(str(first.pid))
    upulse("daemon", "start", "--home", home)
    wait_until(lambda: (process_in(home, "worker") or {}).get("state") == "RUNNING", 20,
               "the worker to be reported RUNNING")
    assert process_in(home, "worker")["restarts_last_hour"] == 0  # type: ignore[index]

    first.kill()
    first.wait(10)
    seen = wait_until(lambda: (process_in(home, "worker") or {}).get("state")
                      in ("BACKOFF", "STARTING"), 20, "the worker to be reported restarting")
    assert seen
    wait_until(lambda: (process_in(home, "worker") or {}).get("state") == "RUNNING", 20,
               "the restarted worker to be reported RUNNING")
    restarted = process_in(home, "worker")
    assert restarted is not None
    new_pid = int(pidfile.read_text())
    assert restarted["pid"] == new_pid != first.pid
    assert restarted["restarts_last_hour"] == 1

    log = log_text(home)
    assert "restarting worker: not running" in log
    assert f"restarted worker: pid {new_pid}" in log
    text = upulse("daemon", "status", "--home", home).stdout
    assert re.search(rf"^worker\s+RUNNING\s+{new_pid}\s+\S+\s+1\b", text, re.MULTILINE), text
    assert "RESTARTS/1h" in text
    errors = status_line(text, "errors")
    assert not errors.rstrip().endswith("none")
    assert "worker: 1 restart(s) in the last hour" in errors
    report = upulse.json("daemon", "status", "--home", home)
    assert isinstance(report, dict)
    (worker,) = report["processes"]
    assert (worker["state"], worker["pid"], worker["restarts_last_hour"]) == \
        ("RUNNING", new_pid, 1)
    assert report["trouble"] == ["worker: 1 restart(s) in the last hour"]


def test_a_process_that_keeps_dying_is_given_up_in_daemon_log_and_fatal_in_status(
        upulse: Upulse, tmp_path: Path, pidfiles: list[Path]) -> None:
    home = upulse.init(tmp_path / "home")
    essential(home, pidfiles, CRASHER, "crasher", startretries=1, backoff_initial_s=0.5)
    upulse("daemon", "start", "--home", home)
    wait_until(lambda: (process_in(home, "crasher") or {}).get("state") == "FATAL", 30,
               "the crasher to be reported FATAL")
    wait_until(lambda: status_file(home).get("notices"), 10, "the give-up notice")
    why = "1 failed starts in a row"
    log = log_text(home)
    assert f"gave up restarting crasher: {why}" in log
    assert f"notice process:crasher [given-up]: gave up restarting crasher: {why}" in log

    text = upulse("daemon", "status", "--home", home).stdout
    assert re.search(rf"^crasher\s+FATAL\s+-\s+-\s+1\s+gave up: {why}$", text, re.MULTILINE)
    assert not status_line(text, "errors").rstrip().endswith("none")
    assert re.search(r"^\S+ ago\s+process:crasher\s+given-up\s+gave up restarting", text,
                     re.MULTILINE), text
    report = upulse.json("daemon", "status", "--home", home)
    assert isinstance(report, dict)
    (notice,) = report["status"]["notices"]
    assert (notice["topic"], notice["level"]) == ("process:crasher", "given-up")
    assert report["processes"][0]["given_up_why"] == why


def test_json_log_lines_parse_and_name_each_event(
        upulse: Upulse, tmp_path: Path, pidfiles: list[Path]) -> None:
    home = upulse.init(tmp_path / "home")
    essential(home, pidfiles, CRASHER, "crasher", startretries=1, backoff_initial_s=0.5)
    config = json.loads((home / "config.json").read_text())
    configure(home, daemon={**config["daemon"], "log_format": "json"})
    upulse("daemon", "start", "--home", home)
    pid = daemon_pid(home)
    assert pid is not None
    wait_until(lambda: "process-given-up" in log_text(home), 30, "the give-up line")
    os.kill(pid, signal.SIGHUP)
    wait_until(lambda: '"reloaded"' in log_text(home), 20, "the reload lines")
    upulse("daemon", "stop", "--home", home)

    lines = [json.loads(line) for line in log_text(home).splitlines()]
    for line in lines:
        assert {"ts", "pid", "level", "event", "message"} <= line.keys(), line
        assert line["ts"].endswith("Z") and datetime.fromisoformat(line["ts"]).tzinfo
        assert line["pid"] == pid and line["level"] in ("info", "warning", "error")
    events = {line["event"]: line for line in lines}
    assert {"ready", "process-restart", "process-restarted", "process-start-failed",
            "process-given-up", "notify", "reload", "reloaded", "stopping",
            "stopped"} <= events.keys()
    given_up = events["process-given-up"]
    assert (given_up["process"], given_up["why"]) == ("crasher", "1 failed starts in a row")
    assert events["reload"]["reason"] == "SIGHUP"
    assert events["notify"]["topic"] == "process:crasher"


def test_a_log_format_that_is_neither_text_nor_json_is_refused_naming_the_field(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    config = json.loads((home / "config.json").read_text())
    configure(home, daemon={**config["daemon"], "log_format": "xml"})
    refused = upulse("daemon", "start", "--home", home, ok=False)
    assert refused.returncode == 1
    assert 'daemon.log_format must be "text" or "json" (default "text"), got "xml"' in \
        refused.stderr
    assert daemon_pid(home) is None


def test_a_rollback_from_the_command_line_is_told_with_its_target_and_reason_and_reloads(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    engine = home / "engine"
    target = git(engine, "rev-parse", "HEAD")
    (engine / "NOTES.md").write_text("a change to roll back\n")
    git(engine, "add", "NOTES.md")
    git(engine, "commit", "-qm", "a change to roll back")
    upulse("daemon", "start", "--home", home)
    upulse("rollback", target, "--reason", "the canary failed", "--home", home)
    short = target[:12]
    # The event comes from another process: the daemon reads it within a second, maybe
    # after its reload, which the command line asked for at once (SIGHUP).
    wait_until(lambda: "reloaded" in log_text(home) and "rolled back to" in log_text(home), 20,
               "the daemon to reload and tell the rollback")
    log = log_text(home)
    assert re.search(rf"rolled back to {short} \(main now at [0-9a-f]{{12}}\), by cli: the "
                     r"canary failed; the code taken out is on branch rolled-back/", log), log
    assert (f"SIGHUP (after the rollback to {short} by cli: the canary failed): reloading"
            in log)


LAYER = '''"""flaky: a layer whose service always fails, for the daemon's loop-restart lines."""

from typing import Any

from pulse_core import Layer, LayerContext


async def flaky(engine: Any) -> None:
    raise RuntimeError("the flaky service broke")


def layer(settings: Any, context: LayerContext) -> Layer:
    return Layer("flaky", services=[flaky])
'''


def with_flaky_layer(upulse: Upulse, site: Path) -> None:
    """Install (on the daemon's path) a layer `flaky` whose one service always raises."""
    info = site / "pulse_flaky_layer-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pulse-flaky-layer\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text("[pulse.layers]\nflaky = pulse_flaky_layer:layer\n")
    (site / "pulse_flaky_layer.py").write_text(LAYER)
    upulse.env["PYTHONPATH"] = os.pathsep.join([str(site), upulse.env["PYTHONPATH"]])


def test_an_engine_loop_that_keeps_failing_is_told_and_listed_with_its_backoff(
        upulse: Upulse, tmp_path: Path) -> None:
    with_flaky_layer(upulse, tmp_path / "site")
    home = upulse.init(tmp_path / "home")
    configure(home, layers={"flaky": None})
    upulse("daemon", "start", "--home", home)
    wait_until(lambda: any(loop["name"] == "service:flaky" and loop["restarts"] >= 3
                           for loop in status_file(home).get("loops", [])), 20,
               "the flaky service to have failed three times")
    assert ("engine loop service:flaky failed and restarts after a backoff: RuntimeError: the "
            "flaky service broke") in log_text(home)
    text = upulse("daemon", "status", "--home", home).stdout
    assert "engine loops not running" in text
    assert re.search(r"^service:flaky\s+BACKOFF\s+\d+\s+RuntimeError: the flaky service broke",
                     text, re.MULTILINE), text


def test_a_line_repeated_quickly_is_counted_then_summarised_once() -> None:
    out, now = io.StringIO(), [0.0]
    log = DaemonLog("json", out, window_s=30, monotonic=lambda: now[0])
    for _ in range(5):
        log.say("cannot reach the store", event="log-unreadable", level="error")
    log.say("something else", event="other")
    now[0] = 10.0
    log.flush()  # inside the window: nothing yet
    now[0] = 31.0
    log.flush()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(line["event"], line.get("repeated")) for line in lines] == [
        ("log-unreadable", None), ("other", None), ("log-unreadable", 4)]
    assert lines[2]["message"] == ("cannot reach the store (said 4 more time(s) within 30 s)")
    log.say("cannot reach the store", event="log-unreadable", level="error")
    assert len(out.getvalue().splitlines()) == 4  # a new window: written again


def test_a_warning_of_the_pulse_logger_takes_the_daemons_json_format() -> None:
    out = io.StringIO()
    records = LogRecords(DaemonLog("json", out))
    logger = logging.getLogger("pulse.events")
    logger.addHandler(records)
    try:
        logger.warning("pulse: %s is slow", "the store")
        logger.info("not a warning: not written")
    finally:
        logger.removeHandler(records)
    (line,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert (line["event"], line["level"], line["logger"], line["message"]) == (
        "pulse-log", "warning", "pulse.events", "pulse: the store is slow")


def test_the_systemd_watchdog_is_served_only_for_this_process() -> None:
    ours = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid()),
            "PATH": "/bin"}
    notifier = SystemdNotifier.from_environment(ours)
    assert notifier.watchdog_s == 2.0 and notifier.socket_path == "@x"
    assert ours == {"PATH": "/bin"}  # the processes the daemon starts never see them
    other = SystemdNotifier.from_environment({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "4000000",
                                              "WATCHDOG_PID": "1"})
    assert other.watchdog_s is None and other.active
    assert not SystemdNotifier.from_environment({}).send("READY=1")


class NotifySocket:
    """A unix datagram socket bound where $NOTIFY_SOCKET will point, read at once by a thread
    as systemd reads it (the kernel queues only a few datagrams: net.unix.max_dgram_qlen)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.1)
        self.watchdogs = 0
        self.received: queue.Queue[str] = queue.Queue()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, name="notify-socket", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                self.received.put(self.sock.recv(4096).decode())
            except TimeoutError:
                continue

    def close(self) -> None:
        self._closed.set()
        self._reader.join(5)
        self.sock.close()

    def watchdog(self) -> None:
        """Wait for the next WATCHDOG=1; no other message may come first."""
        message = self.received.get(timeout=20)
        assert message == "WATCHDOG=1", f"expected WATCHDOG=1, got {message!r}"
        self.watchdogs += 1

    def next(self) -> list[str]:
        """The next message other than WATCHDOG=1 (those are counted), as its lines."""
        while True:
            message = self.received.get(timeout=20)
            if message != "WATCHDOG=1":
                return message.split("\n")
            self.watchdogs += 1


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path (a unix socket's path is limited to 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="pulse-sd-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def run_daemon(upulse: Upulse, home: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "pulse_cli", "daemon", "run", "--home",
                             str(home)], env={**upulse.env, **env}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_sd_notify_says_ready_watchdog_reloading_and_stopping_in_order(
        upulse: Upulse, tmp_path: Path, pidfiles: list[Path]) -> None:
    home = upulse.init(tmp_path / "home")
    seen_env = tmp_path / "env-seen"
    essential(home, pidfiles, "import os, pathlib, time; pathlib.Path("
              f"{str(seen_env)!r}).write_text(os.environ.get('NOTIFY_SOCKET', '-')); "
              "time.sleep(300)", "envprobe")
    notify = NotifySocket(f"@pulse-test-{uuid.uuid4().hex}")
    daemon = run_daemon(upulse, home, NOTIFY_SOCKET=notify.address, WATCHDOG_USEC="200000")
    try:
        ready = notify.next()
        assert ready[0] == "READY=1" and f"MAINPID={daemon.pid}" in ready
        assert any(line.startswith("STATUS=ready: home ") for line in ready)
        wait_until(lambda: seen_env.exists() and seen_env.read_text(), 20,
                   "the essential process to start")
        assert seen_env.read_text() == "-"  # it does not speak for the daemon
        for _ in range(3):
            notify.watchdog()  # served every 0.1 s from READY=1 on
        daemon.send_signal(signal.SIGHUP)
        reloading = notify.next()
        assert reloading[0] == "RELOADING=1" and reloading[1].startswith("MONOTONIC_USEC=")
        assert notify.next()[0] == "READY=1"
        notify.watchdog()  # still served after the reload
        daemon.send_signal(signal.SIGTERM)
        assert notify.next()[0] == "STOPPING=1"
        assert daemon.wait(30) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)
        notify.close()


def test_sd_notify_reaches_a_socket_named_by_its_path(
        upulse: Upulse, tmp_path: Path, short_dir: Path) -> None:
    home = upulse.init(tmp_path / "home")
    notify = NotifySocket(str(short_dir / "notify"))
    daemon = run_daemon(upulse, home, NOTIFY_SOCKET=notify.address)
    try:
        assert notify.next()[0] == "READY=1"
        daemon.send_signal(signal.SIGTERM)
        assert notify.next()[0] == "STOPPING=1"
        assert daemon.wait(30) == 0
        assert notify.watchdogs == 0  # no WATCHDOG_USEC: no watchdog
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)
        notify.close()


async def test_a_business_effects_outcomes_get_a_line_and_housekeeping_none(
        tmp_path: Path) -> None:
    """Issue 26, item 8: the daemon logged nothing about business effects."""
    from pulse_cli.daemon_log import EventNarrator
    from pulse_core import EventDraft, SqliteEventStore

    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        mail, clean, lost = "fx-mail", "fx-clean", "fx-lost"
        await store.append([
            EventDraft("effect", mail, {"effect": {"type": "send-mail", "to": "ana"}}),
            EventDraft("effect", clean, {"effect": {"type": "cleanup", "older_than_s": 1}}),
            EventDraft("effect", lost, {"effect": {"type": "send-mail", "to": "bo"}})])
        await store.append([
            EventDraft("effect-executing", mail, {"attempt": 1, "owner": "t"}),
            EventDraft("effect-failed", mail, {"attempt": 1, "error": "smtp down"}),
            EventDraft("effect-acked", clean, {"attempt": 1}),
            EventDraft("effect-failed", lost, {"attempt": 1, "error": "no such user",
                                               "final": True})])
        await store.append([EventDraft("effect-acked", mail, {"attempt": 2})])
        out = io.StringIO()
        narrator = EventNarrator(DaemonLog("json", out), after_seq=0)
        for event in await store.read(0):
            narrator.narrate(event)
    finally:
        await store.close()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    said = [(line["event"], line["level"], line["effect"], line["message"]) for line in lines]
    assert said == [
        ("effect-outcome", "warning", mail,
         f"effect send-mail {mail} failed (it is retried): smtp down"),
        ("effect-outcome", "error", lost,
         f"effect send-mail {lost} failed (for good): no such user"),
        ("effect-outcome", "info", mail, f"effect send-mail {mail} done")]
    assert lines[2]["type"] == "send-mail" and lines[2]["attempt"] == 2
