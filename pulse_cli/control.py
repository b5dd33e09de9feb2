"""`upulse daemon start|stop|restart|logs`: controlling a home's daemon from outside it.

`start` spawns `python -m pulse_cli daemon run --home HOME` in a new session (stdin from
/dev/null, stdout and stderr appended to HOME/daemon.log) and returns once the daemon has
written HOME/daemon.pid, which it does after its engine has opened the home. Signals are
the whole interface: SIGTERM stops (after draining), SIGHUP reloads the whole engine
(config.json and HOME/engine).

`stop` and `status` need nothing from config.json (the pidfile and what the daemon reports in
daemon.status.json suffice), so a broken config.json never locks the operator out; `restart`
checks config.json before it stops anything and refuses, saying why, while it is broken.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil

from pulse_cli import config as config_file
from pulse_cli.assembly import configured_layers
from pulse_cli.home import EXIT_STATE, CliError, DaemonStateError, Home, UsageError
from pulse_cli.output import print_json, print_json_line, printable
from pulse_core import SystemClock, open_private

READY_TIMEOUT_S = 20.0


def _log_tail(home: Home, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(home.logfile.read_text(errors="replace").splitlines()[-lines:])
    return ""


def start(home: Home, *, foreground: bool = False, as_json: bool = False) -> int:
    """Start the daemon of `home` (in this process with `foreground`); exit 3 if it runs.

    A layer config.json names that is not installed, or refuses its settings, stops the
    start with BrokenLayer (exit 1) before any process is spawned. With `as_json` the
    started daemon's pid and home are printed as one JSON document.
    """
    if foreground and as_json:
        raise UsageError("--json and --foreground do not go together: a foreground daemon "
                         "logs to stdout (set daemon.log_format to json for JSON lines)")
    if foreground:
        _refuse_running(home)
        from pulse_cli.daemon import run  # the engine and its code: only in the daemon

        return run(home)
    pid = _spawn(home)
    if as_json:
        print_json({"home": str(home.root), "pid": pid})
    else:
        print(f"daemon started: pid {pid}, home {home.root}")
    return 0


def _refuse_running(home: Home) -> config_file.Config:
    """config.json, checked as the daemon will use it, once no daemon runs in `home`
    (DaemonStateError when one does)."""
    home.require()
    pid = home.running_pid()
    if pid is not None:
        raise DaemonStateError(
            f"the daemon of {home.root} is already running (pid {pid}) — "
            "`upulse daemon restart` to replace it")
    return _startable(home)


def _spawn(home: Home) -> int:
    """Start the daemon of `home` in a new session; its pid once it is ready."""
    cfg = _refuse_running(home)
    with contextlib.suppress(OSError):
        if home.logfile.stat().st_size > cfg.daemon.log_max_bytes:
            os.replace(home.logfile, home.logfile.with_name("daemon.log.1"))
    with os.fdopen(open_private(home.logfile, os.O_WRONLY | os.O_APPEND), "ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "pulse_cli", "daemon", "run", "--home", str(home.root)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=home.root,
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if home.running_pid() == child.pid:
            return child.pid
        code = child.poll()
        if code == EXIT_STATE:
            raise DaemonStateError(f"the daemon of {home.root} is already running:\n"
                                   f"{_log_tail(home, 3)}")
        if code is not None:
            raise CliError(f"the daemon exited with status {code} before it was ready; "
                           f"the end of {home.logfile}:\n{_log_tail(home)}")
        time.sleep(0.05)
    child.terminate()
    raise CliError(f"the daemon (pid {child.pid}) was not ready within {READY_TIMEOUT_S:g} s; "
                   f"it was asked to stop. The end of {home.logfile}:\n{_log_tail(home)}")


def _startable(home: Home) -> config_file.Config:
    """config.json, checked as the daemon will use it; ConfigError (BrokenLayer for a layer
    that is missing or refuses its settings) when the daemon could not start with it."""
    cfg = config_file.load(home.config)
    configured_layers(home.root, cfg, clock=SystemClock())
    return cfg


def _drain_timeout(home: Home, pid: int) -> float:
    """How long daemon `pid` may drain: what it reports, else config.json's setting, else
    the default (config.json may be broken while the daemon runs)."""
    status = home.daemon_status()
    if status is not None and status.pid == pid and status.drain_timeout_s is not None:
        return status.drain_timeout_s
    try:
        return config_file.load(home.config).daemon.drain_timeout_s
    except config_file.ConfigError:
        return config_file.DaemonSettings().drain_timeout_s


def _gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie waiting to be reaped counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def stop(home: Home, *, timeout: float | None = None, as_json: bool = False) -> int:
    """SIGTERM the daemon and wait until it has drained, closed and exited; with `as_json`
    the stopped daemon's pid is printed as one JSON document."""
    pid = _stop(home, timeout)
    if as_json:
        print_json({"home": str(home.root), "stopped_pid": pid})
    else:
        print(f"daemon stopped (was pid {pid})")
    return 0


def _stop(home: Home, timeout: float | None) -> int:
    """SIGTERM the daemon and wait until it has exited; its pid."""
    pid = home.running_pid()
    if pid is None:
        raise DaemonStateError(f"the daemon of {home.root} is not running")
    if timeout is None:
        timeout = _drain_timeout(home, pid) + 10.0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid):
            return pid
        time.sleep(0.05)
    raise CliError(f"the daemon (pid {pid}) is still running {timeout:g} s after SIGTERM — "
                   f"see {home.logfile}; `kill -9 {pid}` if it hangs")


def restart(home: Home, *, as_json: bool = False) -> int:
    """Stop the daemon if it runs, then start it; a config.json the new daemon could not
    start with is refused first, and the running daemon is left running. With `as_json`
    the stopped daemon's pid (None if none ran) and the started one's are one JSON
    document."""
    pid = home.running_pid()
    if pid is not None:
        try:
            _startable(home)
        except config_file.ConfigError as exc:
            raise CliError(f"restart refused, the daemon (pid {pid}) was left running: {exc}"
                           ) from None
        _stop(home, None)
        if not as_json:
            print(f"daemon stopped (was pid {pid})")
    started = _spawn(home)
    if as_json:
        print_json({"home": str(home.root), "stopped_pid": pid, "pid": started})
    else:
        print(f"daemon started: pid {started}, home {home.root}")
    return 0


def signal_reload(home: Home) -> int | None:
    """SIGHUP the running daemon so it reloads its whole engine; returns its pid (None if
    stopped)."""
    pid = home.running_pid()
    if pid is not None:
        os.kill(pid, signal.SIGHUP)
    return pid


def wait_for_revision(home: Home, revision: str | None, timeout: float) -> bool:
    """Whether the daemon reports running `revision` within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = home.daemon_status()
        if status is not None and status.state == "running" and status.revision == revision:
            return True
        time.sleep(0.1)
    return False


def logs(home: Home, lines: int, follow: bool, as_json: bool = False) -> int:
    """Print the last `lines` lines of daemon.log; with `follow`, keep printing new ones.
    With `as_json` they are a JSON array of strings ([] for no log yet), and with both one
    JSON string a line, each line of the log as it is written."""
    last: list[str] = []
    with contextlib.suppress(OSError):
        text = home.logfile.read_text(errors="replace").splitlines()
        last = text[len(text) - max(lines, 0):]
    if as_json and not follow:
        print_json(last)
        return 0
    for line in last:
        if as_json:
            print_json_line(line)
        else:
            print(printable(line))
    if not home.logfile.exists() and not as_json:
        print(f"no log yet at {home.logfile}")
    if not follow:
        return 0
    sys.stdout.flush()
    position, inode = 0, 0
    with contextlib.suppress(OSError):
        info = home.logfile.stat()
        position, inode = info.st_size, info.st_ino
    while True:
        time.sleep(0.25)
        try:
            info = home.logfile.stat()
        except OSError:
            continue
        if info.st_ino != inode or info.st_size < position:
            inode, position = info.st_ino, 0  # rotated or truncated: read the new file
        if info.st_size > position:
            with open(home.logfile, "rb") as log:
                log.seek(position)
                chunk = log.read()
            if as_json:  # whole lines only: a line cut by the read waits for its end
                chunk = chunk[:chunk.rfind(b"\n") + 1]
                for line in chunk.decode(errors="replace").splitlines():
                    print_json_line(line)
            else:
                sys.stdout.write(printable(chunk.decode(errors="replace"), newlines=True))
                sys.stdout.flush()
            position += len(chunk)
