"""Who holds a claim: the owner an executor loop writes into `effect-executing`, and how
another loop on the same host tells that the owner's process is gone."""

from __future__ import annotations

import os
import socket

import msgspec
import psutil

from pulse_core._effects import EffectEntry
from pulse_core._events import uuid7


def process_started(pid: int) -> float:
    """When process `pid` started, or 0.0 if there is none, or it is dead: a zombie with no
    thread left only waits for its parent to reap it."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE and process.num_threads() <= 1:
            return 0.0
        return float(process.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):  # ValueError: pid < 0
        return 0.0


class Owner(msgspec.Struct, frozen=True):
    """One executor loop as its claims name it: `id` (host, pid and a random part), and the
    pid and start time of its process, which tell a dead owner from a live one."""

    id: str
    host: str
    pid: int
    started: float

    @classmethod
    def here(cls) -> Owner:
        """A new owner for a loop of this process."""
        host, pid = socket.gethostname(), os.getpid()
        return cls(f"{host}:{pid}:{uuid7()[-12:]}", host, pid, process_started(pid))

    def outlived(self, entry: EffectEntry) -> bool:
        """Whether `entry`'s claim was made by a process on this host that has died (or whose
        pid now names another process). Claims from other hosts are judged by their lease."""
        if entry.owner == self.id or not entry.owner.startswith(f"{self.host}:"):
            return False
        if entry.owner_pid == self.pid and entry.owner_started == self.started:
            return False
        return process_started(entry.owner_pid) != entry.owner_started
