"""archive-sessions and cleanup: move old files aside (never delete), a bounded number a run.

They never leave their configured folders: a folder that is itself a symlink is refused, a
symlinked subfolder is never entered, only regular files move, and each one's real path must
lie inside its folder's real path (checked again just before it moves). pulse's own data is
never touched: the home itself, and its objects/, checkpoints/, engine/ and staging/, are
refused as folders, skipped inside one, and refused as the archive; so is an archive that is
a symlink.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pulse_core import ExecutionContext, Executor, PulseError, Retention
from pulse_survival.effects import ArchiveSessions, Cleanup


class FolderRefused(PulseError):
    """A folder given to archive-sessions or cleanup is a symlink (following it could move
    files out of somewhere else entirely: the home, /etc), is the home, lies in pulse's own
    data, or is the archive; or the archive is a symlink or lies in pulse's own data.
    Nothing was moved."""


_HOME = "the engine's home"
PULSE_DATA = ("objects", "checkpoints", "engine", "staging")
"""The folders of a home whose files archive-sessions and cleanup never move."""


def _inside(path: Path, root: Path) -> bool:
    """Whether `path`'s real location lies inside `root` (a real path)."""
    return Path(os.path.realpath(path)).is_relative_to(root)


def _refuse_unsafe(folders: Sequence[str], archive_to: Path, home: Path | None
                   ) -> dict[Path, str]:
    """The real folders a walk must not enter, by what they are; FolderRefused when a folder
    or the archive is unsafe."""
    where = "survival.resource (session_folders, temp_folders)"
    kept: dict[Path, str] = {}
    if home is not None:
        real_home = Path(os.path.realpath(home))
        kept[real_home] = _HOME
        kept.update({real_home / name: f"the home's {name}/" for name in PULSE_DATA})
    if os.path.islink(archive_to):
        raise FolderRefused(f"the archive {archive_to} is a symlink (to "
                            f"{os.path.realpath(archive_to)}): files are never moved through "
                            "one — name the real folder in survival.resource.archive_to")
    archive = Path(os.path.realpath(archive_to))
    inside = _kept_around(archive, kept)
    if inside is not None and inside != _HOME:  # the home's own archive/ is the default
        raise FolderRefused(f"the archive {archive_to} lies in {inside}: files are never moved "
                            "there — name another survival.resource.archive_to")
    kept[archive] = "the archive"
    for folder in folders:
        if os.path.islink(folder):
            raise FolderRefused(
                f"{folder} is a symlink (to {os.path.realpath(folder)}): archive-sessions and "
                f"cleanup never follow one — name the real folder in {where}")
        real = Path(os.path.realpath(folder))
        what = _kept_around(real, kept)
        if what is not None and (real in kept or what != _HOME):  # HOME/logs may be cleaned
            raise FolderRefused(f"{folder} is in {what}: its files are never moved — remove "
                                f"it from {where}")
    return kept


def _kept_around(path: Path, kept: dict[Path, str]) -> str | None:
    """What of `kept` holds `path` (itself or a folder above it), the nearest first."""
    for folder in (path, *path.parents):
        if folder in kept:
            return kept[folder]
    return None


def move_old_files(folders: Sequence[str], archive_to: Path, older_than_s: int,
                   max_files: int, *, now: float | None = None,
                   home: Path | None = None) -> dict[str, Any]:
    """Move regular files last modified more than `older_than_s` ago into
    `archive_to`/<folder name>/.

    Oldest first, at most `max_files`; the archive, the `home` and pulse's data in it are
    never scanned. Raises FolderRefused, moving nothing, if a folder is a symlink, the home,
    in pulse's data or the archive, or the archive is a symlink or in pulse's data.
    Returns what moved and how many bytes left each source folder.
    """
    skipped = _refuse_unsafe(folders, archive_to, home)
    archive = Path(os.path.realpath(archive_to))
    cutoff = (time.time() if now is None else now) - older_than_s
    candidates: list[tuple[float, Path, Path, Path]] = []
    for folder in folders:
        root = Path(folder)
        if not root.is_dir():
            continue
        real_root = Path(os.path.realpath(root))
        for dirpath, dirnames, filenames in os.walk(root):  # never into symlinked folders
            dirnames[:] = [d for d in dirnames
                           if Path(os.path.realpath(Path(dirpath, d))) not in skipped]
            for filename in filenames:
                path = Path(dirpath, filename)
                try:
                    info = path.lstat()
                except OSError:
                    continue
                if info.st_mtime < cutoff and stat.S_ISREG(info.st_mode) \
                        and _inside(path, real_root):
                    candidates.append((info.st_mtime, root, real_root, path))
    candidates.sort()
    moved: list[str] = []
    freed = 0
    for _, root, real_root, path in candidates[:max_files]:
        if os.path.islink(root) or not _inside(path, real_root):
            continue  # swapped for a symlink since the scan: it would leave the folder
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
        report = await asyncio.to_thread(functools.partial(
            move_old_files, effect.folders, archive, effect.older_than_s, effect.max_files,
            home=self.home))
        if isinstance(effect, Cleanup) and effect.vitals_gc and ctx.vitals is not None:
            report["vitals_removed"] = await ctx.vitals.gc(Retention())
        return report
