"""A home's exclusive lock, and the owner-only modes of everything pulse creates in a home.

A home holds webhook URLs, process environments and the agent's memory, so what pulse
creates there is private, as ssh and gpg keep theirs: folders 0700, files 0600, whatever the
umask. What already exists is never changed: `loose_home` words a warning for a home folder
others may enter, which `lock_home` logs (logger "pulse") each time an engine opens a home.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from pulse_core._errors import HomeLocked, HomePermissionDenied

PRIVATE_FOLDER = 0o700
PRIVATE_FILE = 0o600

log = logging.getLogger("pulse")


def denied(path: Path, doing: str) -> HomePermissionDenied:
    """The error for a folder or file of a home this user may not `doing` ("create",
    "write")."""
    return HomePermissionDenied(
        f"{path}: permission denied — this user (uid {os.getuid()}) may not {doing} it; run "
        "pulse as the home's owner, or give the home to this user (`ls -ld` shows the owner "
        "and mode; `chown`, `chmod 700` fix them), or pick a home on writable storage")


def private_folder(path: Path) -> None:
    """Create the folder `path`, and those of its parents that are missing, 0700; folders
    that exist are left as they are. HomePermissionDenied when this user may not."""
    missing = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_FOLDER)
        except FileExistsError:
            continue  # made by another process meanwhile
        except PermissionError:
            raise denied(folder, "create") from None
        os.chmod(folder, PRIVATE_FOLDER)  # the umask may have taken bits away


def private_folders(paths: Iterable[Path]) -> None:
    """`private_folder` for each of `paths`, in order."""
    for path in paths:
        private_folder(path)


def open_private(path: Path, flags: int = os.O_RDWR) -> int:
    """A descriptor of `path` opened with `flags`; a new file is created 0600, an existing
    one keeps its mode. HomePermissionDenied when this user may not."""
    try:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
        except FileExistsError:
            return os.open(path, flags)
    except PermissionError:
        raise denied(path, "create or write") from None
    os.fchmod(fd, PRIVATE_FILE)  # the umask may have taken bits away
    return fd


def create_private(path: Path) -> None:
    """Create `path` as an empty 0600 file unless it exists (HomePermissionDenied if this
    user may not), so that what opens it next keeps it private."""
    if not path.exists():
        os.close(open_private(path, os.O_WRONLY))


def write_private(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically, as a 0600 file (a reader never sees half)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except PermissionError:
        raise denied(path, "write") from None
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), PRIVATE_FILE)
            out.write(data)
        os.replace(tmp, path)
    except PermissionError:
        raise denied(path, "write") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def loose_home(root: Path) -> str | None:
    """The warning for a home folder this user owns that others may enter or list (None
    when it is private, absent, or someone else's: only its owner can change it)."""
    try:
        info = os.stat(root)
    except OSError:
        return None
    mode = stat.S_IMODE(info.st_mode)
    if not mode & 0o077 or info.st_uid != os.getuid():
        return None
    return (f"{root} is open to other users (mode {mode:04o}); it holds webhook URLs, "
            f"process environments and the agent's memory — `chmod 700 {root}` unless you "
            "share it on purpose")


def lock_home(home: Path) -> IO[str]:
    """Take home/engine.lock (flock, non-blocking) and write our pid in it.

    Creates the home (0700) if it does not exist, and logs a warning when others may read
    it. Returns the open file: the lock lasts while it stays open. Raises HomeLocked naming
    the home and the holder's pid when another engine has it, and HomePermissionDenied when
    this user may not create or write the home or its lock.
    """
    private_folder(home)
    warning = loose_home(home)
    if warning is not None:
        log.warning(warning)
    handle = os.fdopen(open_private(home / "engine.lock", os.O_RDWR), "r+")
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
