"""error-log: follows log files and counts lines matching configured patterns since last time.

Each file is read from where the last sample stopped, in bounded chunks: never the whole
file. Rotation (the path names a new file), truncation (the file shrank) and files that do
not exist yet are all followed; watchfiles wakes a collect as soon as a file changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import watchfiles

from pulse_core import Sample, Watcher

CHUNK = 64 * 1024
MAX_READ_PER_COLLECT = 8 * 1024 * 1024

_HANDOVER: dict[Path, tuple[int, int]] = {}
"""Where a closed watcher stopped reading each file (inode, offset), so the watcher a whole
reload builds in the same process carries on there: lines written while the old engine drained
and the new one opened are counted, not skipped as history."""


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
        return await asyncio.to_thread(self._read_all)

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
        samples: list[str] = []
        total = 0
        for followed in self.files:
            count = 0
            for line in self._new_lines(followed):
                hits = [p for p, rx in self.patterns if rx.search(line)]
                if hits:
                    count += 1
                    for p in hits:
                        by_pattern[p] += 1
                    if len(samples) < 5:
                        samples.append(line[:300].decode("utf-8", "replace"))
            per_file[str(followed.path)] = count
            total += count
        return {"matches": total, "by_pattern": by_pattern, "by_file": per_file,
                "examples": samples}

    def _new_lines(self, f: _Followed) -> Iterator[bytes]:
        """Lines appended since the last collect, one at a time: memory stays one chunk."""
        try:
            stat = os.stat(f.path)
        except FileNotFoundError:
            stat = None
        if f.handle is not None and (stat is None or stat.st_ino != f.inode):
            yield from self._drain(f, MAX_READ_PER_COLLECT)  # the rotated file's last lines
            if f.partial:
                yield f.partial
            f.close()
        if stat is None:
            f.started = True  # it does not exist yet: when it appears, all of it is new
            return
        if f.handle is None:
            f.handle = open(f.path, "rb")  # noqa: SIM115 - kept open while followed
            f.inode = stat.st_ino
            handed = _HANDOVER.pop(f.path, None)
            if not f.started and handed is not None and handed[0] == stat.st_ino \
                    and handed[1] <= stat.st_size:
                f.handle.seek(handed[1])  # a previous watcher in this process read up to here
            elif not f.started:
                f.handle.seek(0, os.SEEK_END)  # existing content is history
            f.started = True
        elif stat.st_size < f.handle.tell():
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
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch_task
        for f in self.files:
            f.close()
