"""The engine directory: business code in git, promoted through a gate, rolled back by revert.

    HOME/engine    a git repository; its branch `main` is production (the daemon loads it)
    HOME/staging   a git worktree of it on branch `staging`, where the agent edits

`promote` runs the gate (pulse_cli.gate) on staging and only then merges staging into main
and records a `promote` event; `rollback` adds a commit that brings main's files back to an
earlier revision (history is never rewritten) and records a `rollback` event. Neither makes
a running daemon reload: the CLI signals it (SIGHUP), and a daemon passes `on_rollback` to
GitEngineDirectory for rollbacks the survival layer makes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec

import engine_template
from pulse_cli.gate import GateStep, run_gate
from pulse_cli.git import GitError, git, head, run_git
from pulse_core import EventDraft, EventStore, PulseError, open_home

TEMPLATE = Path(engine_template.__file__).resolve().parent
EVENT_KEY = "engine-directory"
LOCK_NAME = "engine-dir.lock"
LOCK_TIMEOUT_S = 60.0
_NOT_COPIED = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache",
                                     "py.typed")


class EngineDirError(PulseError):
    """The engine directory is missing, half made, or not in a state the operation needs."""


class PromoteResult(msgspec.Struct, frozen=True):
    """What `promote` did. `ok` false: `failed_step` names the step (compile, mypy, tests,
    dry-run, merge), `output` says why, and nothing was changed. `revision` is main's
    commit afterwards; `previous` the one before."""

    ok: bool
    revision: str | None
    previous: str | None
    steps: tuple[GateStep, ...] = ()
    failed_step: str | None = None
    output: str = ""


def _dirs(home: Path) -> tuple[Path, Path]:
    root = home.expanduser().resolve()
    return root / "engine", root / "staging"


def _require(home: Path) -> tuple[Path, Path]:
    engine, staging = _dirs(home)
    for folder in (engine, staging):
        if head(folder) is None:
            raise EngineDirError(f"{folder} is not a git work tree with a commit — run "
                                 f"`upulse init --home {home}` to create the engine directory")
    return engine, staging


@contextlib.asynccontextmanager
async def _exclusive(engine: Path) -> AsyncIterator[None]:
    """Hold HOME/engine-dir.lock (beside `engine`): one promote or rollback changes git at a
    time, across processes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LOCK_TIMEOUT_S
    lock = engine.parent / LOCK_NAME
    handle = await asyncio.to_thread(lock.open, "a")
    try:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if loop.time() > deadline:
                    raise EngineDirError(
                        f"{lock} was held by another promote or rollback for "
                        f"{LOCK_TIMEOUT_S:g} s — let it finish, then try again") from None
                await asyncio.sleep(0.05)
        yield
    finally:
        handle.close()


# -- init ------------------------------------------------------------------------------------


def init_engine_dir(home: Path) -> bool:
    """Create HOME/engine (a git repository of engine_template, one commit on `main`) and
    HOME/staging (its worktree on branch `staging`). Returns False, changing nothing, when
    both exist already; raises EngineDirError when only one does."""
    engine, staging = _dirs(home)
    if engine.exists() and staging.exists():
        return False
    if engine.exists() or staging.exists():
        there, missing = (engine, staging) if engine.exists() else (staging, engine)
        raise EngineDirError(f"{there} exists but {missing} does not — restore it from a "
                             f"backup, or move {there} away and run `upulse init` again")
    engine.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=".engine-", dir=engine.parent))
    try:
        shutil.copytree(TEMPLATE, build, ignore=_NOT_COPIED, dirs_exist_ok=True,
                        copy_function=shutil.copyfile)
        run_git(build, "init", "-q")
        run_git(build, "symbolic-ref", "HEAD", "refs/heads/main")
        run_git(build, "add", "-A")
        run_git(build, "commit", "-q", "-m", "engine directory from pulse's engine_template")
        build.rename(engine)
        run_git(engine, "worktree", "add", "-q", "-b", "staging", str(staging), "main")
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(engine, ignore_errors=True)
        raise
    return True


def revision(home: Path) -> str | None:
    """The commit production runs: HEAD of HOME/engine (None without an engine directory)."""
    return head(_dirs(home)[0])


# -- promote -----------------------------------------------------------------------------------


async def _work_tree_state(staging: Path) -> str:
    """The tree object of staging's files as they are on disk (tracked and new, not ignored),
    computed in a scratch index so neither the branch nor the real index moves."""
    with tempfile.TemporaryDirectory(prefix="upulse-index-") as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        await git(staging, "add", "-A", env=index)
        return await git(staging, "write-tree", env=index)


async def _tree(repo: Path, rev: str) -> str:
    return await git(repo, "rev-parse", "--verify", f"{rev}^{{tree}}")


def _refused(step: str, output: str, previous: str,
             steps: tuple[GateStep, ...] = ()) -> PromoteResult:
    return PromoteResult(ok=False, revision=previous, previous=previous, steps=steps,
                         failed_step=step, output=output)


async def promote(home: Path, *, events: EventStore,
                  dry_run_timeout_s: float = 5.0) -> PromoteResult:
    """Gate staging, then merge it into main and append a `promote` event to `events`.

    The gate (compile, mypy, tests, dry-run; see pulse_cli.gate) runs on staging's files as
    they are; only when every step passes are they committed on `staging` ("promote: staged
    changes") and merged into `main` (fast-forward when possible, else a merge commit). A
    refusal changes nothing: main, staging's branch and the log are as they were. The
    running daemon is not told: send it SIGHUP to load the new revision.
    """
    engine, staging = await asyncio.to_thread(_require, home)
    previous = await git(engine, "rev-parse", "HEAD")
    if await git(engine, "status", "--porcelain"):
        return _refused("merge", f"{engine} has uncommitted changes; production changes "
                        "only through staging — move them to staging, or `git -C "
                        f"{engine} stash` them", previous)
    before = await _work_tree_state(staging)
    ahead = await git(engine, "rev-list", "--count", "HEAD..staging")
    if before == await _tree(engine, "HEAD") and ahead == "0":
        return PromoteResult(ok=True, revision=previous, previous=previous,
                             output=f"nothing to promote: staging matches main ({previous})")
    steps = await run_gate(staging, home, dry_run_timeout_s=dry_run_timeout_s)
    if not steps[-1].ok:
        return _refused(steps[-1].name, steps[-1].output, previous, steps)
    async with _exclusive(engine):
        if await _work_tree_state(staging) != before:
            return _refused("merge", "staging changed while the gate ran; run promote "
                            "again to gate what is there now", previous, steps)
        await git(staging, "add", "-A")
        if await git(staging, "status", "--porcelain"):
            await git(staging, "commit", "-q", "-m", "promote: staged changes")
        previous = await git(engine, "rev-parse", "HEAD")
        try:
            await git(engine, "merge", "--no-edit", "-m", "promote: merge staging", "staging")
        except GitError as exc:
            await git(engine, "merge", "--abort", check=False)
            return _refused("merge", f"{exc} — merge main into staging, resolve, and "
                            "promote again", previous, steps)
        now = await git(engine, "rev-parse", "HEAD")
        await events.append([EventDraft("promote", EVENT_KEY,
                                        {"revision": now, "previous": previous},
                                        origin="cli")])
    return PromoteResult(ok=True, revision=now, previous=previous, steps=steps)


# -- rollback ----------------------------------------------------------------------------------


async def _default_target(engine: Path, events: EventStore) -> str:
    promotes = await events.read(kinds=["promote"])
    if promotes and isinstance(promotes[-1].data, dict) and promotes[-1].data.get("previous"):
        return str(promotes[-1].data["previous"])
    parent = await git(engine, "rev-parse", "--verify", "--quiet", "HEAD~1", check=False)
    if not parent:
        raise EngineDirError(f"nothing to roll back: {engine} has no promote on record and "
                             "main has a single commit")
    return parent


async def _sync_staging(staging: Path) -> str:
    """Merge main into staging so the next edit starts from what runs; on a conflict, leave
    staging as it was and say so."""
    try:
        await git(staging, "merge", "--no-edit", "-m", "rollback: merge main", "main")
    except GitError as exc:
        await git(staging, "merge", "--abort", check=False)
        return f"not synced: {exc} — merge main into staging by hand"
    return "synced"


async def rollback(home: Path, revision: str | None, *, events: EventStore, reason: str,
                   origin: str = "cli") -> str:
    """Bring main's files back to `revision` with a new commit, and return that commit.

    `revision` None means the revision before the last promote (the `previous` of the latest
    `promote` event, else HEAD~1). History is kept: one commit "Revert to <rev>: <reason>"
    whose files are those of `revision`, made with `git commit-tree` and fast-forwarded, so
    promotions that arrived as merges are undone exactly. Main already matching `revision`
    adds no commit. Staging is then merged with main, and a `rollback` event records
    {revision, to, reason, staging}. The running daemon is not told (see module docstring).
    """
    engine, staging = await asyncio.to_thread(_require, home)
    async with _exclusive(engine):
        target = revision or await _default_target(engine, events)
        try:
            target = await git(engine, "rev-parse", "--verify", f"{target}^{{commit}}")
        except GitError as exc:
            raise EngineDirError(f"cannot roll back to {target!r}: no such revision in {engine} "
                                 f"({exc})") from None
        if not await _is_ancestor(engine, target):
            raise EngineDirError(f"cannot roll back to {target}: it is not an earlier revision "
                                 "of main — pick one from `git -C engine log main`")
        now = await git(engine, "rev-parse", "HEAD")
        if await _tree(engine, target) != await _tree(engine, now):
            undone = await git(engine, "log", "--first-parent", "--format=%h %s",
                               f"{target}..{now}")
            message = (f"Revert to {target[:12]}: {reason}\n\nUndoes, on main:\n{undone}\n\n"
                       "(pulse rollback: a new commit with the files of that revision)")
            commit = await git(engine, "commit-tree", f"{target}^{{tree}}", "-p", now,
                               "-m", message)
            await git(engine, "merge", "-q", "--ff-only", commit)
            now = commit
        synced = await _sync_staging(staging)
        await events.append([EventDraft(
            "rollback", EVENT_KEY,
            {"revision": now, "to": target, "reason": reason, "staging": synced},
            origin=origin)])
    return now


async def _is_ancestor(repo: Path, rev: str) -> bool:
    """Whether `rev` is HEAD or one of its ancestors."""
    base = await git(repo, "merge-base", rev, "HEAD", check=False)
    return base == rev


class GitEngineDirectory:
    """The survival layer's EngineDirectory over HOME/engine: `rollback` is git's.

    Without `events` each rollback opens the home's event log (at `store`, a store URL; None:
    the home's own) for its event. `on_rollback` is awaited with the new revision after each
    rollback: a daemon asks for a reload there.
    """

    def __init__(self, home: Path, events: EventStore | None = None, *,
                 store: str | None = None,
                 on_rollback: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.home = home
        self.events = events
        self.store = store
        self.on_rollback = on_rollback

    async def rollback(self, revision: str | None, reason: str) -> str:
        """Roll main back (see `rollback`), as the survival layer; return the new revision."""
        if self.events is not None:
            now = await rollback(self.home, revision, events=self.events, reason=reason,
                                 origin="survival")
        else:
            stores = await open_home(self.home, store=self.store)
            try:
                now = await rollback(self.home, revision, events=stores.events, reason=reason,
                                     origin="survival")
            finally:
                await stores.close()
        if self.on_rollback is not None:
            await self.on_rollback(now)
        return now
