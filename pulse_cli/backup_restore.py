"""`upulse restore SRC`: a home made again from a backup (`upulse backup`, docs/backup.md).

Before anything is written, every file the manifest lists is hashed and compared with it:
a backup that was changed, cut short or corrupted is refused whole. The files are then
copied into a new folder beside the home (HOME's parent/.NAME.restoring-TIME), hashed again
there, and the restored events.db is read back row by row against the backup's, field for
field (pulse_cli.migrate_verify, what `upulse migrate` checks a copy with). Only then does
the folder become the home, in one rename; a home that was there (only with --force) is
kept aside as HOME.before-restore-TIME, never deleted.

A backup holds no element keys (docs/backup.md): the restored home keeps the keys the home
already holds (keys.db copied into the new folder), and `--keys FILE` adds those of a keys
file `upulse backup --keys` wrote; a key destroyed by a purge since stays destroyed.

The home lock is held from the first check to the rename: a daemon, or any engine, that
has the home open refuses the restore (exit 3), and none can start meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import msgspec

from pulse_cli.backup import EVENTS, MANIFEST, BackupManifest, KeysFile, file_entry
from pulse_cli.home import CliError, Home
from pulse_cli.migrate_verify import verify_copy
from pulse_cli.output import Progress, print_json, printable
from pulse_core import HomeLayout, StoreError, private_folder
from pulse_core.store import ElementKeys, copy_sqlite_file, open_event_store, parse_store_url

PAGE = 5_000
SHOWN = 5


class BackupCorrupt(CliError):
    """The backup's manifest is missing or unreadable, or a file it lists is missing or
    differs from its hash: nothing was restored."""


class RestoreRefused(CliError):
    """The home is not empty and --force was not given."""


class Restored(msgspec.Struct):
    """What a restore did: from where to where, what it holds, the verification, and where
    the home that was there was kept."""

    source: str
    home: str
    log: str
    log_included: bool
    last_seq: int
    events: int
    files: int
    verified_events: int
    kept_aside: str | None = None


async def restore(home: Home, *, source: Path, force: bool, as_json: bool,
                  keys_file: Path | None = None) -> int:
    """Restore the backup in `source` into `home` (see the module's docstring); exit 0.
    BackupCorrupt before anything is written; RestoreRefused for a non-empty home without
    `force`; DaemonStateError (exit 3) while an engine holds the home."""
    manifest = read_manifest(source)
    keys = read_keys(keys_file) if keys_file is not None else {}
    say = Progress(quiet=as_json)
    say(f"checking the {len(manifest.files)} files of {source} against its manifest")
    await asyncio.to_thread(check_files, source, manifest, "the backup")
    root = home.root
    stamp = time.strftime("%Y%m%dT%H%M%S")
    new = not root.exists()
    with home.held("restore refused"), _removed_unless_restored(root, new):
        occupied = [p.name for p in root.iterdir() if p.name != HomeLayout(root).lock.name]
        if occupied and not force:
            more = ", …" if len(occupied) > SHOWN else ""
            raise RestoreRefused(
                f"{root} is not empty ({', '.join(sorted(occupied)[:SHOWN])}{more}) — restore into "
                "a new home (--home DIR), or give --force to keep this one aside as "
                f"{root.name}.before-restore-TIME and restore in its place")
        staged = root.with_name(f".{root.name}.restoring-{stamp}")
        try:
            verified = await _stage(source, staged, root, manifest, say)
            await asyncio.to_thread(_keep_keys, root, staged, keys)
            kept = _swap(root, staged, stamp) if occupied else None
            if not occupied:
                _move_in(root, staged)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
    done = Restored(source=str(source), home=str(root), log=manifest.log,
                    log_included=manifest.log_included, last_seq=manifest.last_seq,
                    events=manifest.events, files=len(manifest.files),
                    verified_events=verified, kept_aside=str(kept) if kept else None)
    _report(done, as_json)
    return 0


def read_keys(path: Path) -> dict[str, str]:
    """The element keys of a keys file; BackupCorrupt when it cannot be read."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=KeysFile).keys
    except OSError as exc:
        raise BackupCorrupt(f"--keys {path} cannot be read ({exc.strerror}) — give the file "
                            "`upulse backup --keys` wrote") from None
    except msgspec.DecodeError as exc:
        raise BackupCorrupt(f"--keys {path} is not a keys file ({exc}) — nothing was "
                            "restored") from None


def _keep_keys(root: Path, staged: Path, keys: dict[str, str]) -> None:
    """The home's own keys (a consistent copy of its keys.db) and `keys` into `staged`."""
    layout, target = HomeLayout(root), HomeLayout(staged)
    if layout.keys_db.is_file():
        copy_sqlite_file(layout.keys_db, target.keys_db)
    if keys:
        store = ElementKeys(target.keys_db)
        try:
            store.load(keys)
        finally:
            store.close()


def read_manifest(source: Path) -> BackupManifest:
    """The manifest of the backup in `source`; BackupCorrupt when it cannot be read or
    names a file outside the backup."""
    try:
        manifest = msgspec.json.decode((source / MANIFEST).read_bytes(), type=BackupManifest)
    except OSError as exc:
        raise BackupCorrupt(f"{source / MANIFEST} cannot be read ({exc.strerror}) — give "
                            "the folder `upulse backup` wrote") from None
    except msgspec.DecodeError as exc:
        raise BackupCorrupt(f"{source / MANIFEST} is not a backup manifest ({exc}) — "
                            "nothing was restored") from None
    for name in manifest.files:
        parts = PurePosixPath(name).parts
        if PurePosixPath(name).is_absolute() or ".." in parts or name == MANIFEST:
            raise BackupCorrupt(f"{source / MANIFEST} lists {name!r}, outside the backup — "
                                "nothing was restored")
    return manifest


def check_files(folder: Path, manifest: BackupManifest, what: str) -> None:
    """BackupCorrupt, naming the first few, when a file the manifest lists is missing from
    `folder` or its size or sha256 differs."""
    bad: list[str] = []
    for name, expected in manifest.files.items():
        path = folder / name
        if not path.is_file():
            bad.append(f"{name} is missing")
        elif (found := file_entry(path)) != expected:
            bad.append(f"{name} has sha256 {found.sha256[:12]}…, the manifest "
                       f"{expected.sha256[:12]}…")
    if bad:
        more = f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        raise BackupCorrupt(f"{what} ({folder}) does not match its manifest: "
                            f"{'; '.join(bad[:SHOWN])}{more} — nothing was restored; use "
                            "another backup")


@contextlib.contextmanager
def _removed_unless_restored(root: Path, new: bool) -> Iterator[None]:
    """The home folder removed again (with the lock file taking it made) when it is `new`
    and the restore fails."""
    try:
        yield
    except BaseException:
        if new and root.is_dir():
            HomeLayout(root).lock.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                root.rmdir()
        raise


async def _stage(source: Path, staged: Path, root: Path, manifest: BackupManifest,
                 say: Progress) -> int:
    """The backup's files copied into `staged`, checked against the manifest, the events
    verified row by row and the staging worktree attached to the engine directory as they
    will lie at `root`; the number of events verified."""
    private_folder(staged)
    say(f"copying into {staged}")
    await asyncio.to_thread(_copy_files, source, staged, manifest)
    await asyncio.to_thread(check_files, staged, manifest, "the restored copy")
    verified = 0
    if manifest.log_included:
        verified = await _verify_events(source, staged, manifest, say)
    _attach_worktree(staged, root)
    return verified


def _attach_worktree(staged: Path, root: Path) -> None:
    """Point staging/ and engine/ of `staged` at each other as they will lie at `root`.

    Git links a worktree to its repository by absolute paths, which name the backed-up
    home; `git worktree repair` would follow them and re-point that home's worktree, so
    the two links are written here."""
    link = staged / "staging" / ".git"
    if not link.is_file() or not (staged / "engine" / ".git").is_dir():
        return
    name = Path(link.read_text().removeprefix("gitdir:").strip()).name
    admin = staged / "engine" / ".git" / "worktrees" / name
    if admin.is_dir():
        link.write_text(f"gitdir: {root / 'engine' / '.git' / 'worktrees' / name}\n")
        (admin / "gitdir").write_text(f"{root / 'staging' / '.git'}\n")


def _copy_files(source: Path, staged: Path, manifest: BackupManifest) -> None:
    for name in manifest.files:
        target = staged / name
        for folder in reversed(target.relative_to(staged).parents[:-1]):
            if not (staged / folder).is_dir():
                (staged / folder).mkdir(mode=0o700)
        shutil.copy2(source / name, target)
    for link in _symlinks(source):  # git may keep some; they carry no content to hash
        target = staged / link.relative_to(source)
        if not target.exists() and target.parent.is_dir():
            os.symlink(os.readlink(link), target)


def _symlinks(root: Path) -> Iterator[Path]:
    for folder, _, names in os.walk(root):
        yield from (Path(folder) / n for n in names if (Path(folder) / n).is_symlink())


async def _verify_events(source: Path, staged: Path, manifest: BackupManifest,
                         say: Progress) -> int:
    """Every row of the restored events.db compared with the backup's; BackupCorrupt when a
    row differs or the log does not end at the manifest's last seq."""
    try:
        theirs = await open_event_store(parse_store_url(HomeLayout(source).store_url()),
                                        read_only=True)
        try:
            ours = await open_event_store(parse_store_url(HomeLayout(staged).store_url()),
                                          read_only=True)
            try:
                _, differ = await verify_copy(theirs, ours, manifest.last_seq, PAGE, say)
            finally:
                await ours.close()
        finally:
            await theirs.close()
    except StoreError as exc:
        raise BackupCorrupt(f"the backup's {EVENTS} cannot be read: {exc} — nothing was "
                            "restored") from None
    if differ:
        raise BackupCorrupt(f"the restored {EVENTS} differs from the backup's "
                            f"({'; '.join(differ[:SHOWN])}) — nothing was restored")
    return manifest.last_seq


def _swap(root: Path, staged: Path, stamp: str) -> Path:
    """The home moved aside to HOME.before-restore-TIME and `staged` moved in its place."""
    kept = root.with_name(f"{root.name}.before-restore-{stamp}")
    root.rename(kept)
    staged.rename(root)
    (kept / HomeLayout(kept).lock.name).unlink(missing_ok=True)
    return kept


def _move_in(root: Path, staged: Path) -> None:
    """`staged` becomes the empty (but for its lock) home at `root`."""
    HomeLayout(root).lock.unlink(missing_ok=True)
    root.rmdir()
    staged.rename(root)


def _report(done: Restored, as_json: bool) -> None:
    if as_json:
        print_json(done)
        return
    log = (f"{done.events} events up to seq {done.last_seq}, verified row by row"
           if done.log_included else "no events: the backup holds no log")
    print(printable(f"restored {done.source} into {done.home}: {done.files} files, {log}"))
    if done.kept_aside:
        print(printable(f"the home that was there is kept as {done.kept_aside}"))
    if not done.log_included:
        print(printable(f"the event log ({done.log}) is not in the backup: restore it with "
                        "its own tool (for PostgreSQL: pg_restore --dbname=URL "
                        "events.pgdump), then start the daemon"))
