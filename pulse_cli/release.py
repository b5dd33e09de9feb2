"""`upulse promote|rollback|deploy|dev`: moving business code from staging to the daemon.

The git side (the gate, the merge, the revert) is pulse_cli.enginedir's and
pulse_cli.rollback's; these commands
record it in the live log and tell the running daemon to reload its whole engine (SIGHUP).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import tempfile
from pathlib import Path

import msgspec
import watchfiles

from pulse_cli import config as config_file
from pulse_cli.assembly import NO_CODE, bound_host, build_engine, load_code
from pulse_cli.backtest import BACKTEST_TICKS
from pulse_cli.control import signal_reload, start, wait_for_revision
from pulse_cli.dryrun import copy_home
from pulse_cli.enginedir import PromoteResult
from pulse_cli.enginedir import promote as gate_and_merge
from pulse_cli.home import EXIT_REFUSED, CliError, Home
from pulse_cli.output import clip, print_json, print_json_line, printable, to_json
from pulse_cli.rollback import rollback as revert
from pulse_core import Engine, PulseError, wait_signal
from pulse_survival import NotifySinks


class BacktestDiffExceeded(CliError):
    """The staged code, run over the last recorded ticks, decides more effects otherwise
    than `--max-diff` allows: the promote was refused and nothing moved."""

    exit_code = EXIT_REFUSED


class NoEngineDirectory(CliError):
    """The home has no engine directory (HOME/engine and HOME/staging)."""


def _require_engine_dir(home: Home) -> None:
    home.require()
    if not (home.engine.is_dir() and home.staging.is_dir()):
        raise NoEngineDirectory(
            f"{home.root} has no engine directory (engine/ and staging/) — run `upulse init "
            f"--home {home.root}` to create it")


def _reloaded(home: Home) -> str:
    pid = signal_reload(home)
    if pid is None:
        return "the daemon is not running; it loads this revision when it starts"
    return f"the daemon (pid {pid}) was asked to reload"


def _waiting(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _progress(line: str) -> None:
    print(f"  {line}", flush=True)


async def _promote(home: Home, as_json: bool, backtest_ticks: int,
                   max_diff: int | None) -> PromoteResult:
    """The gate and the merge; without `as_json`, each gate step is printed as it runs.
    BacktestDiffExceeded when the backtest refused the staged code (with `as_json`, after
    the result is printed)."""
    _require_engine_dir(home)
    cfg = config_file.load(home.config)
    result = await gate_and_merge(home.root, store=cfg.store, host=bound_host(home.root, cfg),
                                  backtest_ticks=backtest_ticks, max_diff=max_diff,
                                  waiting=_waiting, progress=None if as_json else _progress)
    if result.failed_step == "backtest":
        if as_json:
            print_json({**msgspec.to_builtins(result), "reload": None})
        else:
            print(printable(result.output, newlines=True))
        raise BacktestDiffExceeded(f"promote refused by the backtest (--max-diff {max_diff}); "
                                   "main and the daemon are untouched")
    if as_json:
        return result
    if not result.ok:
        print(f"promote refused: the {result.failed_step} step failed; main and the daemon "
              f"are untouched\n{printable(result.output, newlines=True)}")
    elif result.output:
        print(printable(result.output, newlines=True))
    return result


async def promote(home: Home, *, as_json: bool, backtest_ticks: int = BACKTEST_TICKS,
                  max_diff: int | None = None) -> int:
    """Run the gate on staging (its backtest over the last `backtest_ticks` recorded ticks,
    refusing more than `max_diff` differing effects); on success record it, merge and make
    the daemon reload.

    The home's log is opened only to record a promote that merged something: a refusal,
    or nothing to promote, leaves every store of the home as it was."""
    result = await _promote(home, as_json, backtest_ticks, max_diff)
    promoted = result.ok and result.revision != result.previous
    reload = _reloaded(home) if promoted else None
    if as_json:
        print_json({**msgspec.to_builtins(result), "reload": reload})
    elif reload is not None:
        print(f"promoted: main is at {result.revision}; {reload}")
    return 0 if result.ok else EXIT_REFUSED


async def rollback(home: Home, revision: str | None, *, reason: str,
                   as_json: bool = False) -> int:
    """Revert main to `revision` (default: before the last promote), record it, reload.

    A refusal (no such revision, or main already has its files: NothingToRollBack) raises
    before anything is recorded or signalled: an error, exit 1."""
    _require_engine_dir(home)
    cfg = config_file.load(home.config)
    done = await revert(home.root, revision, store=cfg.store, host=bound_host(home.root, cfg),
                        reason=reason)
    reload = _reloaded(home)
    if as_json:
        print_json({**msgspec.to_builtins(done), "reload": reload})
        return 0
    print(f"rolled back: main is at {done.revision}; {reload}")
    print(f"the rolled-back code is kept on branch {done.kept}: `git -C {home.engine} "
          f"diff main {done.kept}` shows it, `git -C {home.staging} restore --source "
          f"{done.kept} -- .` puts it back in staging")
    if done.staging != "synced":
        print(f"staging {done.staging}")
    return 0


async def deploy(home: Home, *, wait_s: float, as_json: bool = False,
                 backtest_ticks: int = BACKTEST_TICKS, max_diff: int | None = None) -> int:
    """Promote (see `promote`), then confirm the daemon runs the new revision (starting it
    if stopped)."""
    result = await _promote(home, as_json, backtest_ticks, max_diff)
    if not result.ok:
        if as_json:
            print_json({**msgspec.to_builtins(result), "deployed": None})
        return EXIT_REFUSED
    if home.running_pid() is None:
        with contextlib.redirect_stdout(sys.stderr if as_json else sys.stdout):
            await asyncio.to_thread(start, home)
    else:
        signal_reload(home)
    if not await asyncio.to_thread(wait_for_revision, home, result.revision, wait_s):
        raise CliError(f"promoted revision {result.revision}, but the daemon did not report "
                       f"running it within {wait_s:g} s — see `upulse daemon logs`")
    if as_json:
        print_json({**msgspec.to_builtins(result), "deployed": result.revision})
    else:
        print(f"deployed: the daemon runs revision {result.revision}")
    return 0


def contained(cfg: config_file.Config) -> config_file.Config:
    """`cfg` with the survival settings that act outside the home turned off (essential
    processes, the LLM proxy restart, notification sinks, folders to archive or clean), so
    a scratch engine next to the daemon never does the daemon's work a second time."""
    survival = cfg.survival
    quiet = msgspec.structs.replace(
        survival, processes=(), notify=NotifySinks(),
        llm=msgspec.structs.replace(survival.llm, restart=None),
        resource=msgspec.structs.replace(survival.resource, session_folders=(),
                                         temp_folders=()))
    return dataclasses.replace(cfg, survival=quiet)


def _dev_config(home: Home) -> config_file.Config:
    """The live config, contained, with the scratch home's own event log."""
    return config_file.on_scratch(contained(config_file.load(home.config)))


def _reloads_dev(change: watchfiles.Change, path: str) -> bool:
    """What `upulse dev` reloads on: a .py or config.json under staging, or HOME/config.json."""
    return path.endswith((".py", "config.json")) and "__pycache__" not in path


def _dev_fingerprint(home: Home) -> frozenset[tuple[str, int, int]]:
    """(path, mtime, size) of every file `upulse dev` reloads on (blocking)."""
    found: set[tuple[str, int, int]] = set()
    for root, dirs, files in os.walk(home.staging):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", ".git")]
        for name in files:
            path = os.path.join(root, name)
            if _reloads_dev(watchfiles.Change.modified, path):
                with contextlib.suppress(OSError):
                    stat = os.stat(path)
                    found.add((path, stat.st_mtime_ns, stat.st_size))
    with contextlib.suppress(OSError):
        stat = os.stat(home.config)
        found.add((str(home.config), stat.st_mtime_ns, stat.st_size))
    return frozenset(found)


class _DevEngine:
    """The scratch engine `upulse dev` runs, rebuilt whole when staging or config.json change,
    and the printer of every event it writes."""

    def __init__(self, home: Home, scratch: Path, since: int, *, as_json: bool) -> None:
        self.home, self.scratch, self.seen, self.as_json = home, scratch, since, as_json
        self.engine: Engine | None = None
        self.code = self._built = NO_CODE  # the running engine's code; the last one built
        self._printer: asyncio.Task[None] | None = None

    async def build(self) -> Engine:
        """The engine of the staging code and config.json; PulseError when it cannot be built."""
        cfg = _dev_config(self.home)
        code = await asyncio.to_thread(load_code, self.home.staging, staged=True)
        try:
            engine = build_engine(self.scratch, cfg, code)
        except BaseException:
            code.forget()
            raise
        self._built = code
        return engine

    async def run(self, engine: Engine) -> None:
        """Close the running engine (if any), then open and start `engine` and print its events."""
        await self.close()
        self.code, self._built = self._built, NO_CODE
        await engine.open()
        self.engine = engine
        await engine.start()
        self._printer = asyncio.create_task(self._show(engine))

    async def _show(self, engine: Engine) -> None:
        async for event in engine.events.changes(self.seen, poll_interval=0.5):
            self.seen = event.seq
            if self.as_json:
                print_json_line({"type": "event", **msgspec.to_builtins(event)})
            else:
                print(printable(f"#{event.seq} {event.kind} {event.key} ")
                      + clip(to_json(event.data), 100), flush=True)

    def say(self, what: str, message: str) -> None:
        """Print a message of `upulse dev` (`what`: started, not-runnable, reloaded,
        reload-failed, stopped); with --json as a line {"type": what, "message": ...}."""
        if self.as_json:
            print_json_line({"type": what, "message": message})
        else:
            print(f"dev: {message}", flush=True)

    async def reload(self) -> None:
        """Build the engine again; if that fails, the running one carries on."""
        try:
            engine = await self.build()
        except PulseError as exc:
            self.say("reload-failed", f"reload failed, the previous engine keeps running: {exc}")
            return
        await self.run(engine)
        self.say("reloaded", "reloaded (layers, rules, watchers, executors, projections, "
                 "settings)")

    async def close(self) -> None:
        """Stop printing and close the running engine."""
        printer, self._printer = self._printer, None
        if printer is not None:
            printer.cancel()
            await asyncio.gather(printer, return_exceptions=True)
        engine, self.engine = self.engine, None
        if engine is not None:
            await engine.close()
        self.code.forget()  # a save a minute for hours: each load's modules go with its engine
        self.code = NO_CODE


async def dev(home: Home, *, seconds: float | None, as_json: bool = False) -> int:
    """Run the staging code on a scratch copy of the home, rebuilding the whole engine when a
    file under staging or config.json changes.

    Every event the scratch engine writes is printed; the live home's files are never
    written, and the survival settings that act outside the home are off (see `contained`).
    With `as_json` every event and message is one JSON object per line ({"type": "event",
    ...the event} or {"type": started|not-runnable|reloaded|reload-failed|stopped,
    "message"}).
    """
    _require_engine_dir(home)
    _dev_config(home)  # a broken config.json stops dev before anything starts
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    with tempfile.TemporaryDirectory(prefix="upulse-dev-") as tmp:
        scratch = Path(tmp)
        session = _DevEngine(home, scratch, await copy_home(home, scratch), as_json=as_json)
        seen = await asyncio.to_thread(_dev_fingerprint, home)
        try:
            first = await session.build()
        except config_file.ConfigError:
            raise
        except PulseError as exc:
            session.say("not-runnable", f"the staging code cannot run yet (fix it and save): "
                        f"{exc}")
            first = build_engine(scratch, _dev_config(home), NO_CODE)
        try:
            await session.run(first)
            session.say("started", f"staging code on a scratch copy in {scratch}; saving a "
                        f"file under {home.staging} or {home.config} reloads the engine; "
                        "Ctrl-C stops")

            async def reload_on_change() -> None:
                # The file watch may start after a save: every second, and on each change it
                # reports, the files are compared with what the running engine was built from.
                nonlocal seen
                async for _ in watchfiles.awatch(home.staging, home.config, stop_event=stop,
                                                 watch_filter=_reloads_dev, rust_timeout=1_000,
                                                 yield_on_timeout=True):
                    now = await asyncio.to_thread(_dev_fingerprint, home)
                    if now != seen:
                        seen = now
                        await session.reload()

            watcher = asyncio.create_task(reload_on_change())
            await wait_signal(stop, seconds)
            stop.set()
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        finally:
            await session.close()
    session.say("stopped", "stopped; the scratch copy is gone")
    return 0
