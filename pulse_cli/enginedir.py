"""The engine directory: business code in git, promoted through a gate, rolled back by revert.

    HOME/engine    a git repository; its branch `main` is production (the daemon loads it)
    HOME/staging   a git worktree of it on branch `staging`, where the agent edits

`promote` runs the gate (pulse_cli.gate) on staging and only then records a `promote` event
and fast-forwards main to staging (the event first: main never moves unrecorded);
`rollback` keeps main's code on a branch rolled-back/..., adds a commit that brings main's
files back to an earlier revision (history is never rewritten) and records a `rollback`
event. Neither makes
a running daemon reload: the CLI signals it (SIGHUP), and a daemon passes `on_rollback` to
GitEngineDirectory for rollbacks the survival layer makes.

Two lock files in the home order them across processes: HOME/promote.lock is held by a
promote from its first look at main to its event, so promotes run one after another;
HOME/engine-dir.lock is held by whatever changes git (a promote's merge, a rollback), so a
rollback never waits for a gate. Neither writes the event log until it has something to
record.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec

import engine_template
from pulse_cli.gate import (
    OPEN_TIMEOUT_S,
    STEP_TIMEOUT_S,
    GateStep,
    exclusive_lock,
    require_tools,
    run_gate,
)
from pulse_cli.git import GitError, changed_paths, git, head, is_ancestor, run_git, work_tree_state
from pulse_core import Event, EventDraft, EventStore, PulseError, open_home

TEMPLATE = Path(engine_template.__file__).resolve().parent
EVENT_KEY = "engine-directory"
LOCK_NAME = "engine-dir.lock"
LOCK_TIMEOUT_S = 60.0
PROMOTE_LOCK_NAME = "promote.lock"
PROMOTE_WAIT_S = 2 * STEP_TIMEOUT_S + OPEN_TIMEOUT_S + 2 * LOCK_TIMEOUT_S
"""How long a promote waits for one already running: that one's gate and merge at most."""
_NOT_COPIED = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache",
                                     "py.typed")


class EngineDirError(PulseError):
    """The engine directory is missing, half made, or not in a state the operation needs."""


class RollbackTargetError(EngineDirError):
    """The revision named for a rollback does not exist or is not an earlier commit of main."""


class PromoteNotRecorded(PulseError):
    """The gate passed but the event log refused the `promote` event: main did not move."""


class PromoteResult(msgspec.Struct, frozen=True):
    """What `promote` did. `ok` false: `failed_step` names the step (compile, mypy, tests,
    dry-run, merge), `output` says why, and nothing was changed. `revision` is main's
    commit afterwards; `previous` the one before. The two are equal only when nothing was
    promoted (then nothing was merged or recorded either)."""

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


def _exclusive(engine: Path) -> contextlib.AbstractAsyncContextManager[None]:
    """HOME/engine-dir.lock (beside `engine`): one promote or rollback changes git at a time,
    across processes (LockBusy after LOCK_TIMEOUT_S)."""
    return exclusive_lock(engine.parent / LOCK_NAME, LOCK_TIMEOUT_S,
                          "another promote or rollback")


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


async def _nothing_staged(engine: Path, staging: Path) -> bool:
    """Whether staging has nothing main lacks: no commit of its own, no uncommitted change."""
    ahead = await git(engine, "rev-list", "--count", "HEAD..staging")
    return ahead == "0" and not await asyncio.to_thread(changed_paths, staging)


async def _tree(repo: Path, rev: str) -> str:
    return await git(repo, "rev-parse", "--verify", f"{rev}^{{tree}}")


def _refused(step: str, output: str, previous: str,
             steps: tuple[GateStep, ...] = ()) -> PromoteResult:
    return PromoteResult(ok=False, revision=previous, previous=previous, steps=steps,
                         failed_step=step, output=output)


def _nothing(main: str, why: str, steps: tuple[GateStep, ...] = ()) -> PromoteResult:
    return PromoteResult(ok=True, revision=main, previous=main, steps=steps,
                         output=f"nothing to promote: {why} ({main})")


@contextlib.asynccontextmanager
async def _log(root: Path, events: EventStore | None, store: str | None, *,
               read_only: bool) -> AsyncIterator[EventStore]:
    """`events`; without it the log of the home `root` at the store URL `store`, opened for
    this use only (`read_only`: nothing is written)."""
    if events is not None:
        yield events
        return
    stores = await open_home(root, store=store, read_only=read_only)
    try:
        yield stores.events
    finally:
        await stores.close()


async def promote(home: Path, *, events: EventStore | None = None, store: str | None = None,
                  dry_run_timeout_s: float = 5.0,
                  waiting: Callable[[str], None] | None = None,
                  progress: Callable[[str], None] | None = None) -> PromoteResult:
    """Gate staging, then record a `promote` event and move main to it.

    MissingTools is raised first when git, mypy or pytest is missing (naming all of them).
    The gate (compile, mypy, tests, dry-run; see pulse_cli.gate) runs on staging's files as
    they are, and `progress` hears each step as it starts and ends. Only when every step
    passes are they committed on `staging` ("promote: staged changes"), main merged into
    staging when staging lacks some of it, and {revision, previous} appended to `events`
    (None: the home's log at the store URL `store`, opened for that append only); then main
    is fast-forwarded to that revision. The event comes first, so the log never misses a
    promote: when it cannot be written, main does not move. A refusal, and a promote with
    nothing to merge, write nothing in the home but promote.lock and the gate's mypy cache:
    main, staging and the log stay as they were. Promotes of one home run one at a time:
    `waiting` hears once when this one waits for another, which lasts up to PROMOTE_WAIT_S
    (then LockBusy). The running daemon is not told: send it SIGHUP to load the new revision.
    """
    await asyncio.to_thread(require_tools)
    engine, staging = await asyncio.to_thread(_require, home)
    async with exclusive_lock(engine.parent / PROMOTE_LOCK_NAME, PROMOTE_WAIT_S,
                              "another promote", waiting):
        previous = await git(engine, "rev-parse", "HEAD")
        if await asyncio.to_thread(changed_paths, engine):
            return _refused("merge", f"{engine} has uncommitted changes; production changes "
                            "only through staging — move them to staging, or `git -C "
                            f"{engine} stash` them", previous)
        if await _nothing_staged(engine, staging):
            return _nothing(previous, "staging has nothing main lacks")
        before = await asyncio.to_thread(work_tree_state, staging)
        steps = await run_gate(staging, home, dry_run_timeout_s=dry_run_timeout_s,
                               progress=progress)
        if not steps[-1].ok:
            return _refused(steps[-1].name, steps[-1].output, previous, steps)
        async with _exclusive(engine):
            return await _merge(engine, staging, previous, before, steps, events=events,
                                store=store)


async def _merge(engine: Path, staging: Path, previous: str, before: str,
                 steps: tuple[GateStep, ...], *, events: EventStore | None,
                 store: str | None) -> PromoteResult:
    """Commit staging as the gate saw it, bring main's commits into it, record the promote,
    then fast-forward main to it."""
    main = await git(engine, "rev-parse", "HEAD")
    if main != previous:
        return _refused("merge", f"main moved from {previous} to {main} while the gate ran "
                        "(a rollback?); run promote again to gate staging against it", main,
                        steps)
    if await asyncio.to_thread(work_tree_state, staging) != before:
        return _refused("merge", "staging changed while the gate ran; run promote again to "
                        "gate what is there now", previous, steps)
    await git(staging, "add", "-A")
    if await git(staging, "status", "--porcelain"):
        await git(staging, "commit", "-q", "-m", "promote: staged changes")
    if not await is_ancestor(staging, previous):
        try:
            await git(staging, "merge", "--no-edit", "-m", "promote: merge main", previous)
        except GitError as exc:
            await git(staging, "merge", "--abort", check=False)
            return _refused("merge", f"{exc} — merge main into staging, resolve, and promote "
                            "again", previous, steps)
    now = await git(staging, "rev-parse", "HEAD")
    if now == previous:  # a promote that moved nothing is no promote: nothing to undo
        return _nothing(previous, "main already has everything staging has", steps)
    try:
        async with _log(engine.parent, events, store, read_only=False) as log:
            await log.append([EventDraft("promote", EVENT_KEY,
                                         {"revision": now, "previous": previous},
                                         origin="cli")])
    except PulseError as exc:
        raise PromoteNotRecorded(
            f"the promote of {now} could not be recorded in the event log, so main was not "
            f"moved (it stays at {previous}): {exc} — fix what the log says, then promote "
            "again") from exc
    try:
        await git(engine, "merge", "-q", "--ff-only", now)
    except GitError as exc:  # recorded but not moved: record that main stays where it was
        with contextlib.suppress(PulseError):
            async with _log(engine.parent, events, store, read_only=False) as log:
                await log.append([EventDraft(
                    "rollback", EVENT_KEY,
                    {"revision": previous, "to": previous, "kept": None,
                     "staging": "untouched", "reason": f"the promote of {now} was recorded "
                     f"but main could not move: {exc}"}, origin="cli")])
        raise
    return PromoteResult(ok=True, revision=now, previous=previous, steps=steps)


# -- rollback ----------------------------------------------------------------------------------


class RolledBack(msgspec.Struct, frozen=True):
    """What a rollback did: main is at `revision`, whose files are those of `to`; `kept`
    names the branch holding the code it took out of main (None: main already matched
    `to`); `staging` says whether staging was merged with main ("synced") or why not."""

    revision: str
    to: str
    kept: str | None
    staging: str

    def __str__(self) -> str:
        kept = (f"; the rolled-back code is kept on branch {self.kept}" if self.kept
                else "")
        return f"rollback to {self.to[:12]} (main at {self.revision[:12]}){kept}"


async def _default_target(engine: Path, events: EventStore | None, store: str | None) -> str:
    async with _log(engine.parent, events, store, read_only=True) as log:
        promotes: list[Event] = await log.read(kinds=["promote"])
    if promotes and isinstance(promotes[-1].data, dict) and promotes[-1].data.get("previous"):
        return str(promotes[-1].data["previous"])
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


async def _keep(engine: Path, now: str) -> str:
    """A new branch rolled-back/<UTC time>-<short sha> at `now`; its name."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = f"rolled-back/{stamp}-{now[:12]}"
    await git(engine, "branch", "--no-track", name, now)
    return name


async def _sync_staging(staging: Path) -> str:
    """Merge main into staging so the next edit starts from what runs; on a conflict, leave
    staging as it was and say so."""
    try:
        await git(staging, "merge", "--no-edit", "-m", "rollback: merge main", "main")
    except GitError as exc:
        await git(staging, "merge", "--abort", check=False)
        return f"not synced: {exc} — merge main into staging by hand"
    return "synced"


async def rollback(home: Path, revision: str | None, *, reason: str,
                   events: EventStore | None = None, store: str | None = None,
                   origin: str = "cli") -> RolledBack:
    """Bring main's files back to `revision` with a new commit, and say what was done.

    `revision` None means the revision before the last promote (the `previous` of the latest
    `promote` event, else HEAD~1); one that is not an earlier commit of main raises
    RollbackTargetError. History is kept: the code taken out stays on a new branch
    rolled-back/<UTC time>-<short sha>, and one commit "Revert to <rev>: <reason>" whose
    files are those of `revision` is made with `git commit-tree` and fast-forwarded, so
    promotions that arrived as merges are undone exactly. Main already matching `revision`
    adds no commit and no branch. Staging is then merged with main, and a `rollback` event
    records {revision, to, reason, kept, staging} in `events` (None: the home's log at the
    store URL `store`, read and written only for this rollback; a refused rollback writes
    nothing). The running daemon is not told (see module docstring).
    """
    engine, staging = await asyncio.to_thread(_require, home)
    async with _exclusive(engine):
        target = await _target(engine, revision or await _default_target(engine, events,
                                                                           store))
        now = await git(engine, "rev-parse", "HEAD")
        kept = None
        if await _tree(engine, target) != await _tree(engine, now):
            kept = await _keep(engine, now)
            undone = await git(engine, "log", "--first-parent", "--format=%h %s",
                               f"{target}..{now}")
            message = (f"Revert to {target[:12]}: {reason}\n\nUndoes, on main:\n{undone}\n\n"
                       f"(pulse rollback: a new commit with the files of that revision; the "
                       f"code it takes out is kept on branch {kept})")
            commit = await git(engine, "commit-tree", f"{target}^{{tree}}", "-p", now,
                               "-m", message)
            await git(engine, "merge", "-q", "--ff-only", commit)
            now = commit
        done = RolledBack(now, target, kept, await _sync_staging(staging))
        async with _log(engine.parent, events, store, read_only=False) as log:
            await log.append([EventDraft(
                "rollback", EVENT_KEY,
                {"revision": now, "to": target, "reason": reason, "kept": kept,
                 "staging": done.staging}, origin=origin)])
    return done


class GitEngineDirectory:
    """The survival layer's EngineDirectory over HOME/engine: `rollback` is git's.

    Without `events` each rollback opens the home's event log (at `store`, a store URL; None:
    the home's own) for its event. `on_rollback` is awaited with what each rollback did
    (its str is a log line naming the branch that keeps the rolled-back code): a daemon
    asks for a reload there.
    """

    def __init__(self, home: Path, events: EventStore | None = None, *,
                 store: str | None = None,
                 on_rollback: Callable[[RolledBack], Awaitable[None]] | None = None) -> None:
        self.home = home
        self.events = events
        self.store = store
        self.on_rollback = on_rollback

    async def rollback(self, revision: str | None, reason: str) -> str:
        """Roll main back (see `rollback`), as the survival layer; return the new revision."""
        done = await rollback(self.home, revision, reason=reason, events=self.events,
                              store=self.store, origin="survival")
        if self.on_rollback is not None:
            await self.on_rollback(done)
        return done.revision
