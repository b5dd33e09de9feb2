"""The engine directory: business code in git, promoted through a gate, rolled back by revert.

    HOME/engine    a git repository; its branch `main` is production (the daemon loads it)
    HOME/staging   a git worktree of it on branch `staging`, where the agent edits

`promote` runs the gate (pulse_cli.gate) on staging and only then records a `promote` event
and fast-forwards main to staging (the event first: main never moves unrecorded);
pulse_cli.rollback brings main's files back to an earlier revision. `reconcile` makes the
log agree with main again after a process stopped between an event and git. Neither makes
a running daemon reload: the CLI signals it (SIGHUP), and a daemon passes `on_rollback` to
GitEngineDirectory for rollbacks the survival layer makes. What these events say, under
which key, and how the log is brought to agree with main is pulse_cli.directory_log's.

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
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

import engine_template
from pulse_cli.backtest import BACKTEST_TICKS
from pulse_cli.directory_log import (
    directory_event,
    event_log,
    reconcile_held,
    reconcile_log,
    record_main,
)
from pulse_cli.gate import (
    OPEN_TIMEOUT_S,
    STEP_TIMEOUT_S,
    GateStep,
    exclusive_lock,
    require_tools,
    run_gate,
)
from pulse_cli.git import GitError, changed_paths, git, head, is_ancestor, run_git, work_tree_state
from pulse_core import EventStore, PulseError

TEMPLATE = Path(engine_template.__file__).resolve().parent
LOCK_NAME = "engine-dir.lock"
LOCK_TIMEOUT_S = 60.0
PROMOTE_LOCK_NAME = "promote.lock"
PROMOTE_WAIT_S = 2 * STEP_TIMEOUT_S + OPEN_TIMEOUT_S + 2 * LOCK_TIMEOUT_S
"""How long a promote waits for one already running: that one's gate and merge at most."""
_NOT_COPIED = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache",
                                     "py.typed")


class EngineDirError(PulseError):
    """The engine directory is missing, half made, or not in a state the operation needs."""


class PromoteNotRecorded(PulseError):
    """The gate passed but the event log refused the `promote` event: main did not move."""


class PromoteNotApplied(EngineDirError):
    """The `promote` event was recorded but git could not move main; a `rollback` event to
    the unchanged main follows it in the log (when the log takes it)."""


class PromoteResult(msgspec.Struct, frozen=True):
    """What `promote` did. `ok` false: `failed_step` names the step (compile, mypy, tests,
    dry-run, backtest, merge), `output` says why, and nothing was changed. `revision` is
    main's commit afterwards; `previous` the one before. The two are equal only when nothing
    was promoted (then nothing was merged or recorded either). The backtest step's
    `backtest` is what the gate's backtest found."""

    ok: bool
    revision: str | None
    previous: str | None
    steps: tuple[GateStep, ...] = ()
    failed_step: str | None = None
    output: str = ""


def _dirs(home: Path) -> tuple[Path, Path]:
    root = home.expanduser().resolve()
    return root / "engine", root / "staging"


def require_dirs(home: Path) -> tuple[Path, Path]:
    """HOME/engine and HOME/staging; EngineDirError when either is not a work tree."""
    engine, staging = _dirs(home)
    for folder in (engine, staging):
        if head(folder) is None:
            raise EngineDirError(f"{folder} is not a git work tree with a commit — run "
                                 f"`upulse init --home {home}` to create the engine directory")
    return engine, staging


def hold_engine_dir(engine: Path) -> contextlib.AbstractAsyncContextManager[None]:
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


def _refused(step: str, output: str, previous: str,
             steps: tuple[GateStep, ...] = ()) -> PromoteResult:
    return PromoteResult(ok=False, revision=previous, previous=previous, steps=steps,
                         failed_step=step, output=output)


def _nothing(main: str, why: str, steps: tuple[GateStep, ...] = ()) -> PromoteResult:
    return PromoteResult(ok=True, revision=main, previous=main, steps=steps,
                         output=f"nothing to promote: {why} ({main})")


async def promote(home: Path, *, events: EventStore | None = None, store: str | None = None,
                  host: str = "", dry_run_timeout_s: float = 5.0,
                  backtest_ticks: int = BACKTEST_TICKS, max_diff: int | None = None,
                  waiting: Callable[[str], None] | None = None,
                  progress: Callable[[str], None] | None = None) -> PromoteResult:
    """Gate staging, then record a `promote` event and move main to it.

    MissingTools is raised first when git, mypy or pytest is missing (naming all of them).
    The gate (compile, mypy, tests, dry-run, backtest over the last `backtest_ticks`
    recorded ticks, refused past `max_diff` differing effects; see pulse_cli.gate) runs on
    staging's files as they are, and `progress` hears each step as it starts and ends. A
    backtest that replayed something is recorded in the `promote` event. Only when every step
    passes are they committed on `staging` ("promote: staged changes"), main merged into
    staging when staging lacks some of it, and {revision, previous} appended to `events`
    (None: the home's log at the store URL `store`, opened for that append only) under the
    key of `host`, the host this home is bound to (see pulse_cli.directory_log.event_key;
    '' for a log of its own, as pulse_core._assembly.placement gives it); then main is
    fast-forwarded to that revision. The event comes first, so the log never misses a
    promote: when it cannot be written, main does not move. A refusal, and a promote with
    nothing to merge, write nothing in the home but promote.lock and the gate's mypy cache:
    main, staging and the log stay as they were. Promotes of one home run one at a time:
    `waiting` hears once when this one waits for another, which lasts up to PROMOTE_WAIT_S
    (then LockBusy). The running daemon is not told: send it SIGHUP to load the new revision.
    """
    await asyncio.to_thread(require_tools)
    engine, staging = await asyncio.to_thread(require_dirs, home)
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
                               backtest_ticks=backtest_ticks, max_diff=max_diff,
                               progress=progress)
        if not steps[-1].ok:
            return _refused(steps[-1].name, steps[-1].output, previous, steps)
        async with hold_engine_dir(engine):
            return await _merge(engine, staging, previous, before, steps, events=events,
                                store=store, host=host)


async def _merge(engine: Path, staging: Path, previous: str, before: str,
                 steps: tuple[GateStep, ...], *, events: EventStore | None,
                 store: str | None, host: str) -> PromoteResult:
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
        async with event_log(engine.parent, events, store, read_only=False) as log:
            await reconcile_log(engine, log, previous, "cli", host)
            await log.append([directory_event("promote", _promoted(now, previous, steps),
                                              host, "cli")])
    except PulseError as exc:
        raise PromoteNotRecorded(
            f"the promote of {now} could not be recorded in the event log, so main was not "
            f"moved (it stays at {previous}): {exc} — fix what the log says, then promote "
            "again") from exc
    try:
        await git(engine, "merge", "-q", "--ff-only", now)
    except GitError as exc:  # recorded but not moved: record that main stays where it was
        noted = "a `rollback` event notes it"
        try:
            async with event_log(engine.parent, events, store, read_only=False) as log:
                await record_main(log, previous, f"the promote of {now} was recorded but "
                                   f"main could not move: {exc.said}", "cli", host)
        except PulseError:
            noted = ("the log could not note it either; the next promote, rollback or daemon "
                     "start does")
        raise PromoteNotApplied(
            f"the promote of {now} was recorded but main could not move and stays at "
            f"{previous} ({exc.said}); {noted} — fix what git says (a leftover "
            f"{engine / '.git' / 'index.lock'}: remove it if no git command is running "
            "there), then `upulse promote` again") from exc
    return PromoteResult(ok=True, revision=now, previous=previous, steps=steps)


def _promoted(now: str, previous: str, steps: tuple[GateStep, ...]) -> dict[str, object]:
    """The `promote` event's data: the revisions, and the backtest when it replayed ticks."""
    data: dict[str, object] = {"revision": now, "previous": previous}
    backtest = next((s.backtest for s in steps if s.backtest is not None), None)
    if backtest is not None and backtest.ticks:
        data["backtest"] = msgspec.to_builtins(backtest)
    return data


# -- the log and main agree --------------------------------------------------------------------


async def reconcile(home: Path, events: EventStore | None = None, *, store: str | None = None,
                    host: str = "", origin: str = "cli") -> str | None:
    """Make the log say what main runs: when the last `promote` or `rollback` event recorded
    for this home (under the key of `host`, see pulse_cli.directory_log.event_key) names
    another revision than main's HEAD (a process stopped between recording and moving main),
    append a `rollback` event to HEAD whose reason says so, and return that reason; None when
    they agree or the home has no engine directory. `events` None: the home's log at the
    store URL `store`. Promote and rollback do this first; so does a starting daemon."""
    engine, _ = _dirs(home)
    if await asyncio.to_thread(head, engine) is None:
        return None
    async with hold_engine_dir(engine):
        return await reconcile_held(engine, events, store, origin, host=host)


class RolledBack(msgspec.Struct, frozen=True):
    """What a rollback did (pulse_cli.rollback): main is at `revision`, whose files are those
    of `to`; `kept` names the branch holding the code it took out of main; `staging` says
    whether staging was merged with main ("synced") or why not."""

    revision: str
    to: str
    kept: str
    staging: str

    def __str__(self) -> str:
        return (f"rollback to {self.to[:12]} (main at {self.revision[:12]}); the rolled-back "
                f"code is kept on branch {self.kept}")


class GitEngineDirectory:
    """The survival layer's EngineDirectory over HOME/engine: `rollback` is git's.

    Without `events` each rollback opens the home's event log (at `store`, a store URL; None:
    the home's own) for its event, which goes under the key of `host` (the host the home is
    bound to, '' for a log of its own; see pulse_cli.directory_log.event_key). `on_rollback`
    is awaited with what each rollback did (its str is a log line naming the branch that
    keeps the rolled-back code): a daemon asks for a reload there.
    """

    def __init__(self, home: Path, events: EventStore | None = None, *,
                 store: str | None = None, host: str = "",
                 on_rollback: Callable[[RolledBack], Awaitable[None]] | None = None) -> None:
        self.home = home
        self.events = events
        self.store = store
        self.host = host
        self.on_rollback = on_rollback

    async def rollback(self, revision: str | None, reason: str) -> str:
        """Roll main back (see pulse_cli.rollback), as the survival layer; return the new
        revision. When main already has the target's files this returns main's revision and
        records and reloads nothing: the `effect-acked` of the Rollback says where main is,
        and the survival ledger closed the promotion on the Rollback effect itself."""
        from pulse_cli.rollback import NothingToRollBack, rollback  # it builds on this module

        try:
            done = await rollback(self.home, revision, reason=reason, events=self.events,
                                  store=self.store, host=self.host, origin="survival")
        except NothingToRollBack as nothing:
            return nothing.revision
        if self.on_rollback is not None:
            await self.on_rollback(done)
        return done.revision


