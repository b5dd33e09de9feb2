"""Rollback: main's files back to an earlier revision, with a new commit (never a reset).

The code taken out of main is kept on a branch rolled-back/<UTC time>-<short sha>, made
only once main has moved; a `rollback` event records what was done. A rollback with
nothing to change (main already has the target's files) is refused and writes nothing.
Like promote, a rollback first makes the log agree with main (pulse_cli.enginedir.reconcile)
and holds HOME/engine-dir.lock while it changes git.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pulse_cli.directory_log import directory_event, event_log, last_recorded, reconcile_held
from pulse_cli.enginedir import EngineDirError, RolledBack, hold_engine_dir, require_dirs
from pulse_cli.git import GitError, git, is_ancestor
from pulse_core import EventStore


class RollbackTargetError(EngineDirError):
    """The revision named for a rollback does not exist or is not an earlier commit of main."""


class NothingToRollBack(EngineDirError):
    """Main already has the files of the rollback's target (`to`): main stays at `revision`,
    and nothing was committed, kept or recorded."""

    def __init__(self, engine: Path, revision: str, to: str) -> None:
        super().__init__(f"nothing to roll back: main already has the files of {to[:12]} — "
                         "to go further back, name an earlier revision (`git -C "
                         f"{engine} log --oneline main` lists them)")
        self.revision = revision
        self.to = to


class RollbackNotApplied(EngineDirError):
    """git could not move main to the revert commit: main, the branches and the log are as
    they were."""


async def _default_target(engine: Path, events: EventStore | None, store: str | None,
                          host: str) -> str:
    """The `previous` of the last promote recorded for `host`'s engine directory, else
    HEAD~1."""
    async with event_log(engine.parent, events, store, read_only=True) as log:
        promote = await last_recorded(log, host, ["promote"])
    data = promote.data if promote is not None else None
    if isinstance(data, dict) and data.get("previous"):
        return str(data["previous"])
    parent = await git(engine, "rev-parse", "--verify", "--quiet", "HEAD~1", check=False)
    if not parent:
        raise EngineDirError(f"nothing to roll back: {engine} has no promote on record and "
                             "main has a single commit")
    return parent


async def _target(engine: Path, revision: str) -> str:
    """The full sha of `revision`, an earlier commit of main; RollbackTargetError otherwise."""
    listing = f"`git -C {engine} log --oneline main` lists main's revisions"
    found = await git(engine, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}",
                      check=False)
    if not found:
        raise RollbackTargetError(
            f"cannot roll back to {revision!r}: {engine} has no such revision — name one of "
            f"main's revisions ({listing}), or leave it out to undo the last promote")
    if not await is_ancestor(engine, found):
        raise RollbackTargetError(
            f"cannot roll back to {revision!r}: it is not an earlier revision of main — pick "
            f"one of main's revisions ({listing})")
    return found


async def _tree(repo: Path, rev: str) -> str:
    return await git(repo, "rev-parse", "--verify", f"{rev}^{{tree}}")


async def _revert(engine: Path, now: str, target: str, reason: str) -> tuple[str, str]:
    """Commit `target`'s files on top of `now`, fast-forward main to it and keep `now` on a
    new branch rolled-back/<UTC time>-<short sha>; (the commit, the branch). When main
    cannot move, the branch is removed again and RollbackNotApplied says why."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept = f"rolled-back/{stamp}-{now[:12]}"
    await git(engine, "branch", "--no-track", kept, now)
    try:
        undone = await git(engine, "log", "--first-parent", "--format=%h %s",
                           f"{target}..{now}")
        message = (f"Revert to {target[:12]}: {reason}\n\nUndoes, on main:\n{undone}\n\n"
                   f"(pulse rollback: a new commit with the files of that revision; the "
                   f"code it takes out is kept on branch {kept})")
        commit = await git(engine, "commit-tree", f"{target}^{{tree}}", "-p", now,
                           "-m", message)
        await git(engine, "merge", "-q", "--ff-only", commit)
    except GitError as exc:
        await git(engine, "branch", "-D", kept, check=False)
        raise RollbackNotApplied(
            f"the rollback to {target[:12]} could not move main, which stays at {now} "
            f"({exc.said}); nothing was recorded — fix what git says (a leftover "
            f"{engine / '.git' / 'index.lock'}: remove it if no git command is running "
            "there), then roll back again") from exc
    return commit, kept


async def _sync_staging(staging: Path) -> str:
    """Merge main into staging so the next edit starts from what runs; on a conflict, leave
    staging as it was and say so."""
    try:
        await git(staging, "merge", "--no-edit", "-m", "rollback: merge main", "main")
    except GitError as exc:
        await git(staging, "merge", "--abort", check=False)
        return f"not synced: {exc.said} — merge main into staging by hand"
    return "synced"


async def rollback(home: Path, revision: str | None, *, reason: str,
                   events: EventStore | None = None, store: str | None = None,
                   host: str = "", origin: str = "cli") -> RolledBack:
    """Bring main's files back to `revision` with a new commit, and say what was done.

    `revision` None means the revision before the last promote (the `previous` of the latest
    `promote` event recorded for this home, under the key of `host`, else HEAD~1); one that
    is not an earlier commit of main raises RollbackTargetError, and one whose files main
    already has NothingToRollBack. History is kept: one commit "Revert to <rev>: <reason>"
    whose files are those of `revision` is made with `git commit-tree` and fast-forwarded,
    so promotions that arrived as merges are undone exactly, and the code taken out stays on
    a new branch rolled-back/<UTC time>-<short sha>. When git cannot move main,
    RollbackNotApplied leaves no branch and no event. Staging is then merged with main, and
    a `rollback` event records {revision, to, reason, kept, staging} in `events` (None: the
    home's log at the store URL `store`, read and written only for this rollback) under the
    key of `host`, the host the home is bound to ('' for a log of its own; see
    pulse_cli.directory_log.event_key). A refused rollback writes nothing, unless the log
    disagreed with main beforehand (see pulse_cli.enginedir.reconcile). The running daemon
    is not told: the CLI sends it SIGHUP.
    """
    engine, staging = await asyncio.to_thread(require_dirs, home)
    async with hold_engine_dir(engine):
        await reconcile_held(engine, events, store, origin, host=host)
        target = await _target(engine, revision or await _default_target(engine, events,
                                                                           store, host))
        now = await git(engine, "rev-parse", "HEAD")
        if await _tree(engine, target) == await _tree(engine, now):
            raise NothingToRollBack(engine, now, target)
        commit, kept = await _revert(engine, now, target, reason)
        done = RolledBack(commit, target, kept, await _sync_staging(staging))
        async with event_log(engine.parent, events, store, read_only=False) as log:
            await log.append([directory_event(
                "rollback", {"revision": commit, "to": target, "reason": reason, "kept": kept,
                             "staging": done.staging}, host, origin)])
    return done
