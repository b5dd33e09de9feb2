"""What tests ask of a process by its pid."""

from __future__ import annotations

import psutil


def alive(pid: int) -> bool:
    """Whether process `pid` runs: it exists and is no zombie (exited, waiting to be reaped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def exited(pid: int) -> bool:
    """Whether process `pid` has exited: gone, or a zombie."""
    return not alive(pid)
