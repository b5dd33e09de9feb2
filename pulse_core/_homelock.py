"""The exclusive lock an engine holds on its home, so two engines never share one."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from pulse_core._errors import HomeLocked


def lock_home(home: Path) -> IO[str]:
    """Take home/engine.lock (flock, non-blocking) and write our pid in it.

    Returns the open file: the lock lasts while it stays open. Raises HomeLocked naming the
    home and the holder's pid when another engine has it.
    """
    home.mkdir(parents=True, exist_ok=True)
    handle = open(home / "engine.lock", "a+")  # noqa: SIM115 - held while the engine runs
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise HomeLocked(
            f"{home} is held by another engine (pid {holder}) — stop it, or give this "
            "engine another home"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle
