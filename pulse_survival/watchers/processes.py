"""process-alive: whether each essential process runs, found by pidfile, name or command line,
else by its configured argv (a process started by hand is adopted, never started twice)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from pulse_core import Essential, Sample, Watcher, process_age_s, process_started


def same_command(cmdline: Sequence[str], argv: Sequence[str]) -> bool:
    """Whether a process's `cmdline` is `argv` run: the same arguments, and the same program
    (its path, or the same file name: `python3` and `/usr/bin/python3`)."""
    if not argv or len(cmdline) != len(argv) or list(cmdline[1:]) != list(argv[1:]):
        return False
    return cmdline[0] == argv[0] or os.path.basename(cmdline[0]) == os.path.basename(argv[0])


def has_env(proc: psutil.Process, wanted: dict[str, str]) -> bool:
    """Whether `proc` has each of `wanted`'s variables set to its value (False when its
    environment cannot be read: another user's process)."""
    if not wanted:
        return True
    try:
        env = proc.environ()
    except psutil.Error:
        return False
    return all(env.get(name) == value for name, value in wanted.items())


def _named(spec: Essential, name: str, cmdline: Sequence[str]) -> bool:
    """Whether a process called `name` running `cmdline` is the one `spec`'s `match_name`
    or `match_cmdline` names."""
    if spec.match_name and name == spec.match_name:
        return True
    if spec.match_cmdline:
        return spec.match_cmdline in " ".join(cmdline)
    return False


def find_process(spec: Essential) -> psutil.Process | None:
    """The live process `spec` describes, or None: the one its pidfile names, else the first
    whose name is `match_name` or whose command line holds `match_cmdline`, else one of this
    user's whose command line is `argv` (as supervisord or systemd started it, or by hand);
    one found other than by its pidfile must have `match_env` in its environment. A zombie
    is dead unless a thread of it still runs (its main thread ended before the others)."""
    if spec.pidfile:
        try:
            pid = int(Path(spec.pidfile).read_text().split()[0])
            proc = psutil.Process(pid)
            if proc.is_running() and process_started(pid):  # a zombie with no thread: dead
                return proc
        except (OSError, ValueError, IndexError, psutil.Error):
            pass
    if not (spec.match_name or spec.match_cmdline or spec.argv):
        return None
    by_argv: psutil.Process | None = None
    me, uid = os.getpid(), os.getuid()
    for proc in psutil.process_iter(["name", "cmdline", "status", "uids"]):
        try:
            if proc.pid == me or (proc.info["status"] == psutil.STATUS_ZOMBIE
                                  and not process_started(proc.pid)):
                continue
            argv = proc.info["cmdline"] or ()
            if _named(spec, proc.info["name"], argv) and has_env(proc, spec.match_env):
                return proc
            if by_argv is None and proc.info["uids"] is not None \
                    and proc.info["uids"].real == uid and same_command(argv, spec.argv) \
                    and has_env(proc, spec.match_env):
                by_argv = proc
        except psutil.Error:
            continue
    return by_argv


class ProcessAliveWatcher(Watcher):
    """For each essential process: alive, pid, uptime, and how many restarts were seen."""

    name = "process-alive"
    interval = 2.0

    def __init__(self, processes: Sequence[Essential], interval: float = 2.0) -> None:
        super().__init__()
        self.processes = tuple(processes)
        self.interval = interval
        self._last_pid: dict[str, int] = {}
        self._restarts: dict[str, int] = {}

    def _read(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for spec in self.processes:
            proc = find_process(spec)
            if proc is None:
                out[spec.name] = {"alive": False, "pid": None, "uptime_s": 0.0,
                                  "restarts_seen": self._restarts.get(spec.name, 0)}
                continue
            last = self._last_pid.get(spec.name)
            if last is not None and last != proc.pid:
                self._restarts[spec.name] = self._restarts.get(spec.name, 0) + 1
            self._last_pid[spec.name] = proc.pid
            uptime = process_age_s(proc.pid)  # 0.0 once it died meanwhile
            out[spec.name] = {"alive": True, "pid": proc.pid, "uptime_s": round(uptime, 3),
                              "restarts_seen": self._restarts.get(spec.name, 0)}
        return out

    async def collect(self) -> dict[str, Any]:
        return await self.in_thread(self._read)

    def should_wake(self, window: Sequence[Sample]) -> bool:
        if not window or not window[-1].ok or not isinstance(window[-1].data, dict):
            return False
        return any(not p.get("alive") for p in window[-1].data.values())
