"""restart-process: start an essential process again, detached, with its own pidfile and log."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pulse_core import Essential, ExecutionContext, Executor
from pulse_survival.effects import RestartProcess


def write_pidfile(path: Path, pid: int) -> None:
    """Write `pid` to `path` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".pid-")
    with os.fdopen(fd, "w") as out:
        out.write(f"{pid}\n")
    os.replace(tmp, path)


class RestartProcessExecutor(Executor):
    """Starts `argv` (never through a shell) in a new session, stdout and stderr to its log,
    with the engine's environment and the process's configured `env` (from `processes`, by
    name: the effect in the log names the variables, never their values).

    Children that exit are reaped on the next restart, so none lingers as a zombie.
    """

    handles = (RestartProcess,)
    timeout = 15.0
    max_attempts = 2

    def __init__(self, log_dir: Path, processes: Sequence[Essential] = ()) -> None:
        self.log_dir = log_dir
        self.environments = {spec.name: dict(spec.env) for spec in processes}
        self._children: list[subprocess.Popen[bytes]] = []

    def _spawn(self, effect: RestartProcess) -> int:
        self._children = [c for c in self._children if c.poll() is None]
        if not effect.argv:
            raise ValueError(f"process {effect.name!r} has no argv to restart it with")
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
        return child.pid

    async def execute(self, effect: RestartProcess, ctx: ExecutionContext) -> dict[str, Any]:
        pid = await asyncio.to_thread(self._spawn, effect)
        return {"name": effect.name, "pid": pid}
