"""restart-process and stop-process: start an essential process again, detached, with its own
pidfile and log; stop one (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from pulse_core import Essential, ExecutionContext, Executor, process_started
from pulse_survival.effects import RestartProcess, StopProcess
from pulse_survival.watchers import find_process

STOP_WAIT_S = 10.0
"""How long a restart that replaces a running process waits for it after SIGTERM
(supervisord's stopwaitsecs)."""
KILL_WAIT_S = 5.0
"""How long a process killed with SIGKILL is waited for."""


def write_pidfile(path: Path, pid: int) -> None:
    """Write `pid` to `path` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".pid-")
    with os.fdopen(fd, "w") as out:
        out.write(f"{pid}\n")
    os.replace(tmp, path)


EXIT_POLL_S = 0.05
"""How often a stopping process that is not this one's child is looked at again."""


def stop(proc: psutil.Process, wait_s: float) -> str:
    """Stop `proc`: SIGTERM, then SIGKILL after `wait_s`; the signal that ended it (a child
    of this process is reaped). A process that exited but that its parent has not reaped
    yet (a zombie with no thread left: one started by hand from a program that does not
    wait for it) has ended; one whose main thread ended while another runs has not."""
    try:
        proc.terminate()
        if _ended(proc, wait_s):
            return "SIGTERM"
        proc.kill()
        if not _ended(proc, KILL_WAIT_S):
            raise psutil.TimeoutExpired(KILL_WAIT_S, proc.pid)
        return "SIGKILL"
    except psutil.NoSuchProcess:
        return "already gone"


def _ended(proc: psutil.Process, wait_s: float) -> bool:
    """Whether `proc` ends within `wait_s` seconds (reaped if it is this one's child)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            proc.wait(max(0.0, min(EXIT_POLL_S, deadline - time.monotonic())))
            return True
        except psutil.TimeoutExpired:
            if not process_started(proc.pid):  # gone, or a zombie only its parent waits on
                return True
            if time.monotonic() >= deadline:
                return False


class RestartProcessExecutor(Executor):
    """Starts `argv` (never through a shell) in a new session, stdout and stderr to its log,
    with the engine's environment and the process's configured `env` (from `processes`, by
    name: the effect in the log names the variables, never their values). A process already
    running (started by hand, say) is adopted, not started twice, unless the effect
    `replace`s it; a stop finds the process as the process watcher does.

    Children that exit are reaped on the next restart, so none lingers as a zombie.
    """

    handles = (RestartProcess, StopProcess)
    timeout = 30.0
    max_attempts = 2

    def __init__(self, log_dir: Path, processes: Sequence[Essential] = ()) -> None:
        self.log_dir = log_dir
        self.specs = {spec.name: spec for spec in processes}
        self.environments = {spec.name: dict(spec.env) for spec in processes}
        self._children: list[subprocess.Popen[bytes]] = []

    def _running(self, name: str) -> psutil.Process | None:
        spec = self.specs.get(name)
        return None if spec is None else find_process(spec)

    def _spawn(self, effect: RestartProcess) -> dict[str, Any]:
        self._children = [c for c in self._children if c.poll() is None]
        if not effect.argv:
            raise ValueError(f"process {effect.name!r} has no argv to restart it with")
        running = self._running(effect.name)
        stopped: dict[str, Any] = {}
        if running is not None and not effect.replace:
            return {"name": effect.name, "pid": running.pid, "adopted": True}
        if running is not None:
            stopped = {"stopped": running.pid, "signal": stop(running, STOP_WAIT_S)}
        log = Path(effect.log) if effect.log else self.log_dir / f"{effect.name}.log"
        log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # A new log is the owner's only (0600): a process's output may hold its secrets.
        with os.fdopen(os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as out:
            child = subprocess.Popen(
                list(effect.argv), cwd=effect.cwd,
                env={**os.environ, **effect.env, **self.environments.get(effect.name, {})},
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
            )
        self._children.append(child)
        if effect.pidfile:
            write_pidfile(Path(effect.pidfile), child.pid)
        return {"name": effect.name, "pid": child.pid, **stopped}

    def _stop(self, effect: StopProcess) -> dict[str, Any]:
        running = self._running(effect.name)
        if running is None:
            return {"name": effect.name, "pid": None, "signal": "not running"}
        return {"name": effect.name, "pid": running.pid, "signal": stop(running, effect.wait_s)}

    async def execute(self, effect: RestartProcess | StopProcess,
                      ctx: ExecutionContext) -> dict[str, Any]:
        if isinstance(effect, StopProcess):
            return await asyncio.to_thread(self._stop, effect)
        return await asyncio.to_thread(self._spawn, effect)
