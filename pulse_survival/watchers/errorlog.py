"""error-log: follows log files and counts lines matching configured patterns since last time.

Each file is read from where the last sample stopped, in bounded chunks: never the whole
file. Rotation (the path names a new file), truncation (the file shrank) and files that do
not exist yet are all followed; watchfiles wakes a collect as soon as a file changes. Only
regular files are read: a FIFO, socket, device or directory at a followed path is refused
without ever being waited on.
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import secrets
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import msgspec
import watchfiles

from pulse_core import Sample, Watcher, wait_ended

CHUNK = 64 * 1024
MAX_READ_PER_COLLECT = 8 * 1024 * 1024
LATEST = 3
"""How many of the newest matching lines a sample's totals carry."""

_HANDOVER: dict[Path, tuple[int, int]] = {}
"""Where a closed watcher stopped reading each file (inode, offset), so the watcher a whole
reload builds in the same process carries on there: lines written while the old engine drained
and the new one opened are counted, not skipped as history."""


class ErrorTotals(msgspec.Struct, frozen=True):
    """What one watcher has counted since it started (`run` names that start): every
    matching line, per pattern, and the newest `LATEST` of them. Counters only grow within a
    run, so the lines between two readings are the difference of their totals."""

    run: str
    matches: int
    by_pattern: dict[str, int]
    latest: tuple[str, ...] = ()


def error_totals(data: Any) -> ErrorTotals | None:
    """The totals an error-log sample's data carries; None if it carries none readable."""
    if not isinstance(data, dict):
        return None
    try:
        return msgspec.convert(data.get("totals"), ErrorTotals)
    except msgspec.ValidationError:
        return None


class NotRegular(OSError):
    """A followed path names something that is not a regular file (it is never opened for a
    read that could block)."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a directory"))


def _refuse_unless_regular(path: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    what = next((name for test, name in _KINDS if test(mode)), "not a file")
    raise NotRegular(f"{path} is {what}, not a regular file — error_log.files must name "
                     "regular log files")


def _open_regular(path: Path) -> tuple[IO[bytes], os.stat_result]:
    """`path` opened for reading without waiting (O_NONBLOCK), and checked once open: a
    FIFO swapped in after the stat is refused too."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        opened = os.fstat(fd)
        _refuse_unless_regular(path, opened.st_mode)
        return os.fdopen(fd, "rb"), opened
    except BaseException:
        os.close(fd)
        raise


class _Followed:
    """One log file being followed: the open handle, its inode, the unfinished last line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle: IO[bytes] | None = None
        self.inode: int | None = None
        self.partial = b""
        self.skipping = False  # inside the rest of a line cut at max_line_bytes
        self.started = False

    def close(self) -> None:
        if self.handle is not None:
            if self.inode is not None and not self.skipping:
                _HANDOVER[self.path] = (self.inode, self.handle.tell() - len(self.partial))
            self.handle.close()
        self.handle, self.inode, self.partial, self.skipping = None, None, b"", False


class ErrorLogWatcher(Watcher):
    """Counts lines matching `patterns` (regular expressions) in `files` since the last sample.

    A line is counted once however many patterns it matches; `by_pattern` tells which.
    Lines already in a file when following starts are history and are not counted.
    """

    name = "error-log"
    interval = 5.0

    def __init__(self, files: Sequence[str], patterns: Sequence[str],
                 max_line_bytes: int = 64 * 1024, interval: float = 5.0) -> None:
        super().__init__()
        self.files = [_Followed(Path(f)) for f in files]
        self.patterns = [(p, re.compile(p.encode())) for p in patterns]
        self.max_line_bytes = max_line_bytes
        self.interval = interval
        self._watch_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._run = secrets.token_hex(8)
        self._total = 0
        self._total_by_pattern = {p: 0 for p, _ in self.patterns}
        self._latest: collections.deque[str] = collections.deque(maxlen=LATEST)

    async def collect(self) -> dict[str, Any]:
        task = self._watch_task
        if task is not None and task.done():
            # The file watch (nudges between collects) died: say so in this sample, start it
            # again on the next collect. Polling every `interval` goes on regardless.
            self._watch_task = None
            if not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"watching {', '.join(str(f.path) for f in self.files)} "
                                   f"for changes failed: {task.exception()}")
        if self._watch_task is None and self.files:
            self._watch_task = asyncio.create_task(self._watch(), name="pulse-error-log-watch")
        return await self.in_thread(self._read_all)

    def _watch_targets(self) -> tuple[list[str], set[str]]:
        """The folders to watch and the file paths to look for in watchfiles' changes.

        watchfiles reports absolute paths: compare against the absolute (and the resolved)
        form of each file, so relative or symlinked paths in the config nudge too.
        """
        folders = sorted({os.path.abspath(f.path.parent) for f in self.files
                          if f.path.parent.is_dir()})
        names = {os.path.abspath(f.path) for f in self.files} | {
            os.path.join(os.path.realpath(f.path.parent), f.path.name) for f in self.files}
        return folders, names

    async def _watch(self) -> None:
        folders, names = await asyncio.to_thread(self._watch_targets)
        if not folders:
            return
        async for changes in watchfiles.awatch(*folders, stop_event=self._stop,
                                               debounce=50, step=20):
            if any(path in names for _, path in changes):
                self.nudge()

    def _read_all(self) -> dict[str, Any]:
        by_pattern = {p: 0 for p, _ in self.patterns}
        per_file: dict[str, int] = {}
        refused: dict[str, str] = {}
        samples: list[str] = []
        total = 0
        for followed in self.files:
            count = 0
            try:
                for line in self._new_lines(followed):
                    hits = [p for p, rx in self.patterns if rx.search(line)]
                    if hits:
                        count += 1
                        self._total += 1  # counted at once: a read that fails later keeps it
                        for p in hits:
                            by_pattern[p] += 1
                            self._total_by_pattern[p] += 1
                        text = line[:300].decode("utf-8", "replace")
                        self._latest.append(text)
                        if len(samples) < 5:
                            samples.append(text)
            except NotRegular as exc:
                refused[str(followed.path)] = str(exc)
            per_file[str(followed.path)] = count
            total += count
        totals = ErrorTotals(self._run, self._total, dict(self._total_by_pattern),
                             tuple(self._latest))
        return {"matches": total, "by_pattern": by_pattern, "by_file": per_file,
                "examples": samples, "refused": refused, "totals": msgspec.to_builtins(totals)}

    def _new_lines(self, f: _Followed) -> Iterator[bytes]:
        """Lines appended since the last collect, one at a time: memory stays one chunk."""
        try:
            found: os.stat_result | None = os.stat(f.path)
        except FileNotFoundError:
            found = None
        if f.handle is not None and (found is None or found.st_ino != f.inode):
            yield from self._drain(f, MAX_READ_PER_COLLECT)  # the rotated file's last lines
            if f.partial:
                yield f.partial
            f.close()
        if found is None:
            f.started = True  # it does not exist yet: when it appears, all of it is new
            return
        if f.handle is None:
            if not stat.S_ISREG(found.st_mode):
                f.started = True  # as if missing: a regular file that replaces it is all new
                _refuse_unless_regular(f.path, found.st_mode)
            f.handle, found = _open_regular(f.path)
            f.inode = found.st_ino
            handed = _HANDOVER.pop(f.path, None)
            if not f.started and handed is not None and handed[0] == found.st_ino \
                    and handed[1] <= found.st_size:
                f.handle.seek(handed[1])  # a previous watcher in this process read up to here
            elif not f.started:
                f.handle.seek(0, os.SEEK_END)  # existing content is history
            f.started = True
        elif found.st_size < f.handle.tell():
            f.handle.seek(0)  # truncated in place
            f.partial, f.skipping = b"", False
        yield from self._drain(f, MAX_READ_PER_COLLECT)

    def _drain(self, f: _Followed, budget: int) -> Iterator[bytes]:
        assert f.handle is not None
        limit = self.max_line_bytes
        while budget > 0:
            chunk = f.handle.read(min(CHUNK, budget))
            if not chunk:
                break
            budget -= len(chunk)
            if f.skipping:  # the rest of a line already counted by its first bytes
                end = chunk.find(b"\n")
                if end < 0:
                    continue
                chunk, f.skipping = chunk[end + 1:], False
            parts = (f.partial + chunk).split(b"\n")
            f.partial = parts.pop()
            if len(f.partial) > limit:
                parts.append(f.partial)
                f.partial, f.skipping = b"", True
            for part in parts:
                yield part if len(part) <= limit else part[:limit]

    def should_wake(self, window: Sequence[Sample]) -> bool:
        return bool(window) and window[-1].ok and bool(window[-1].data.get("matches"))

    async def aclose(self) -> None:
        self._stop.set()
        watching = self._watch_task
        try:
            if watching is not None:
                watching.cancel()
                # not awaited: a cancel of this close propagates (a failed watch, closing,
                # has no sample left to report in)
                await wait_ended(watching)
        finally:  # the files are closed (their offsets handed over) even if this close is cut
            if self.busy_for() is None:  # a read still blocked holds them: it would wait on it
                for f in self.files:
                    f.close()
