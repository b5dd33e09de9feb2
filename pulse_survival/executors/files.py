"""archive-sessions and cleanup: move old files aside (never delete), a bounded number a run."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pulse_core import ExecutionContext, Executor, Retention
from pulse_survival.effects import ArchiveSessions, Cleanup


def move_old_files(folders: Sequence[str], archive_to: Path, older_than_s: int,
                   max_files: int, now: float | None = None) -> dict[str, Any]:
    """Move files last modified more than `older_than_s` ago into `archive_to`/<folder name>/.

    Oldest first, at most `max_files`; the archive itself is never scanned. Returns what moved
    and how many bytes left each source folder.
    """
    cutoff = (time.time() if now is None else now) - older_than_s
    candidates: list[tuple[float, Path, Path]] = []
    archive = archive_to.resolve()
    for folder in folders:
        root = Path(folder)
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if Path(dirpath, d).resolve() != archive]
            for filename in filenames:
                path = Path(dirpath, filename)
                try:
                    mtime = path.lstat().st_mtime
                except OSError:
                    continue
                if mtime < cutoff and path.is_file():
                    candidates.append((mtime, root, path))
    candidates.sort()
    moved: list[str] = []
    freed = 0
    for _, root, path in candidates[:max_files]:
        target = archive / root.name / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        size = path.stat().st_size
        shutil.move(path, target)
        moved.append(str(path))
        freed += size
    return {"moved": len(moved), "bytes_freed": freed, "files": moved[:50],
            "left": max(0, len(candidates) - max_files)}


class FileArchiveExecutor(Executor):
    """Runs archive-sessions and cleanup; cleanup also collects expired vitals samples."""

    handles = (ArchiveSessions, Cleanup)
    timeout = 120.0
    max_attempts = 2

    def __init__(self, home: Path) -> None:
        self.home = home

    async def execute(self, effect: ArchiveSessions | Cleanup, ctx: ExecutionContext
                      ) -> dict[str, Any]:
        archive = Path(effect.archive_to)
        if not archive.is_absolute():
            archive = self.home / archive
        report = await asyncio.to_thread(move_old_files, effect.folders, archive,
                                         effect.older_than_s, effect.max_files)
        if isinstance(effect, Cleanup) and effect.vitals_gc and ctx.vitals is not None:
            report["vitals_removed"] = await ctx.vitals.gc(Retention())
        return report
