"""The end of an essential process's output log: where it is, its last lines, and new lines
as they are written (`upulse process log`, the Processes page's log view)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from pulse_core import Essential, PulseError

BLOCK = 64 * 1024
LINE_CHARS = 4_000
"""The longest line shown; the rest of a longer one is cut."""
MAX_LINES = 5_000
"""The most lines one tail gives."""


class NoProcessLog(PulseError, LookupError):
    """An essential process has no output log to read: none is configured and pulse does not
    start it, or pulse has not written it yet."""


def output_log(spec: Essential, log_dir: Path) -> Path | None:
    """Where `spec`'s stdout and stderr go when pulse starts it: its `log`, else
    LOG_DIR/NAME.log; None when it has neither a `log` nor an `argv` (pulse never starts it,
    so its output goes wherever whoever starts it sends it)."""
    if spec.log:
        return Path(spec.log)
    return log_dir / f"{spec.name}.log" if spec.argv else None


def log_of(spec: Essential, log_dir: Path) -> Path:
    """`spec`'s output log, which must exist; NoProcessLog saying why not."""
    path = output_log(spec, log_dir)
    if path is None:
        raise NoProcessLog(f"{spec.name} has no output log: no `log` is configured and pulse "
                           "does not start it (no `argv`) — set `log` in its survival.processes "
                           "entry to the file its output goes to")
    if not path.is_file():
        raise NoProcessLog(f"{spec.name}'s output log {path} does not exist yet: pulse "
                           f"writes it when it starts {spec.name}")
    return path


def _lines(data: bytes) -> list[str]:
    return [line[:LINE_CHARS] for line in data.decode("utf-8", "replace").splitlines()]


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of the file at `path` (at most MAX_LINES), read from its end."""
    lines = max(0, min(lines, MAX_LINES))
    if lines == 0:
        return []
    with path.open("rb") as log:
        end = log.seek(0, os.SEEK_END)
        at, data = end, b""
        while at > 0 and data.count(b"\n") <= lines:
            step = min(BLOCK, at)
            at -= step
            log.seek(at)
            data = log.read(step) + data
    return _lines(data)[-lines:]


def follow(path: Path, *, poll_s: float = 0.25) -> Iterator[str]:
    """The lines written to `path` from now on (from this call), as they come (blocking; a
    truncated or replaced file is read again from its start). Ends only when its caller
    stops."""
    now = path.stat()
    return _following(path, now.st_size, now.st_ino, poll_s)


def _following(path: Path, size: int, inode: int, poll_s: float) -> Iterator[str]:
    rest = b""
    while True:
        try:
            now = path.stat()
        except FileNotFoundError:
            time.sleep(poll_s)
            continue
        if now.st_ino != inode or now.st_size < size:  # rotated or truncated
            inode, size, rest = now.st_ino, 0, b""
        if now.st_size == size:
            time.sleep(poll_s)
            continue
        with path.open("rb") as log:
            log.seek(size)
            data = rest + log.read(now.st_size - size)
        size = now.st_size
        complete, newline, rest = data.rpartition(b"\n")
        if newline:
            yield from _lines(complete + newline)
