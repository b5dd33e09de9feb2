"""The daemon process: one engine on one home, until SIGTERM; SIGHUP reloads its rules.

The engine runs the survival layer, the built-in rules and the business code of HOME/engine
(when that fails to load, the survival layer runs alone and an `error` event says why). Once
the engine holds the home and has opened its stores, the daemon writes HOME/daemon.pid; it
refreshes HOME/daemon.status.json every second; on SIGTERM it drains effects in flight
(up to `daemon.drain_timeout_s`), closes the engine and removes the pidfile.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import msgspec

from pulse_cli import config as config_file
from pulse_cli.enginedir import GitEngineDirectory
from pulse_cli.home import EXIT_STATE, DaemonStatus, Home
from pulse_cli.loader import EngineCode, EngineCodeError, load_engine_code, reload_rules
from pulse_cli.output import now_ms
from pulse_core import Engine, EventDraft, HomeLocked, PulseError

STATUS_EVERY_S = 1.0
NO_CODE = EngineCode(rules=(), watchers=(), executors=(), projections=(), revision=None)


def load_code(code_dir: Path) -> EngineCode:
    """The business code in `code_dir` (HOME/engine or HOME/staging); none without the folder.

    Raises EngineCodeError when the code does not load.
    """
    return load_engine_code(code_dir) if code_dir.is_dir() else NO_CODE


def build_engine(root: Path, cfg: config_file.Config, code: EngineCode, *,
                 directory: GitEngineDirectory | None = None) -> Engine:
    """An engine on `root` with the config's settings and `code` as its business code."""
    return Engine(root, rules=code.rules, watchers=code.watchers, executors=code.executors,
               projections=code.projections, survival=cfg.survival,
               engine_directory=directory, default_tick_ms=cfg.default_tick_ms,
               drain_timeout=cfg.daemon.drain_timeout_s)


def say(message: str) -> None:
    """One line of the daemon's log: time, pid, message."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} upulse[{os.getpid()}]: {message}", flush=True)


def _rotate_log(home: Home, max_bytes: int) -> None:
    """Move daemon.log to daemon.log.1 once it passes `max_bytes`, if it is our stdout."""
    try:
        ours = os.fstat(1).st_ino == home.logfile.stat().st_ino
        too_big = home.logfile.stat().st_size > max_bytes
    except OSError:
        return
    if not (ours and too_big):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.replace(home.logfile, home.logfile.with_name("daemon.log.1"))
    fd = os.open(home.logfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    say(f"log rotated (previous part: {home.logfile.name}.1)")


def _load_error(code_dir: Path, exc: PulseError) -> EventDraft:
    return EventDraft("error", "engine:load", {
        "where": "engine:load", "type": getattr(exc, "error_type", type(exc).__name__),
        "message": str(exc), "dir": str(code_dir)}, origin="engine")


class Daemon:
    """One home's daemon: its engine, its status file, its reactions to signals."""

    def __init__(self, home: Home, cfg: config_file.Config) -> None:
        self.home = home
        self.cfg = cfg
        self.pid = os.getpid()
        self.status = DaemonStatus(self.pid, "starting", now_ms(), now_ms(), cfg.instance)
        self.directory = (GitEngineDirectory(home.root, on_rollback=self._rolled_back)
                          if home.engine.is_dir() else None)
        self.problems: list[EventDraft] = []
        self.engine = self._build()
        self._wake = asyncio.Event()
        self._requests: set[str] = set()

    def _build(self) -> Engine:
        """The engine with HOME/engine's code; without it if that code cannot run."""
        try:
            code = load_code(self.home.engine)
            engine = build_engine(self.home.root, self.cfg, code, directory=self.directory)
        except PulseError as exc:  # broken business code must not stop the survival layer
            say(f"engine code in {self.home.engine} cannot run; survival rules only: {exc}")
            self.problems.append(_load_error(self.home.engine, exc))
            code = NO_CODE
            engine = build_engine(self.home.root, self.cfg, code, directory=self.directory)
        self.status.revision = code.revision
        return engine

    def request(self, what: str) -> None:
        """Ask the main loop to `stop` or `reload` (called from signal handlers)."""
        self._requests.add(what)
        self._wake.set()

    async def reload(self, why: str) -> None:
        """Load HOME/engine's rules again; on failure the old ones keep running."""
        if not self.home.engine.is_dir():
            say(f"{why}: {self.home.engine} does not exist; nothing to reload")
            return
        try:
            revision = await reload_rules(self.engine, self.home.engine)
        except EngineCodeError as exc:
            say(f"{why}: reload failed, the previous rules keep running: {exc}")
        else:
            self.status.revision = revision
            say(f"{why}: business rules reloaded, revision {revision or 'none'}")
        self.status.reloads += 1
        self.status.last_reload_at = now_ms()
        self._write_status()

    async def _rolled_back(self, revision: str) -> None:
        await self.reload(f"rollback to {revision}")

    def _write_status(self) -> None:
        status = self.status
        status.ticks, status.last_tick_at = self.engine.ticks, self.engine.last_tick_at
        status.tick_ms, status.updated_at = self.engine.last_tick_ms, now_ms()
        tmp = self.home.statusfile.with_suffix(".json.tmp")
        tmp.write_bytes(msgspec.json.encode(status))
        os.replace(tmp, self.home.statusfile)

    async def run(self) -> int:
        """Serve until SIGTERM or SIGINT; exit code 3 if another engine holds the home."""
        loop = asyncio.get_running_loop()
        for signum, what in ((signal.SIGTERM, "stop"), (signal.SIGINT, "stop"),
                             (signal.SIGHUP, "reload")):
            loop.add_signal_handler(signum, self.request, what)
        try:
            await self.engine.open()
        except HomeLocked as exc:
            say(f"not started: {exc}")
            return EXIT_STATE
        try:
            await self._serve()
        finally:
            await self.engine.close()
            self.home.remove_pidfile(self.pid)
            self.status.state, self.status.stopped_at = "stopped", now_ms()
            self._write_status()
        say("stopped")
        return 0

    async def _serve(self) -> None:
        if self.directory is not None:
            self.directory.events = self.engine.events
        if self.problems:
            await self.engine.append(self.problems)
        await self.engine.start()
        self.home.write_pidfile(self.pid)
        self.status.state = "running"
        self._write_status()
        say(f"ready: home {self.home.root}, revision {self.status.revision or 'none'}, "
            f"{len(self.engine.rule_names)} rules")
        while "stop" not in self._requests:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STATUS_EVERY_S):
                    await self._wake.wait()
            self._wake.clear()
            if "reload" in self._requests and "stop" not in self._requests:
                self._requests.discard("reload")
                await self.reload("SIGHUP")
            self._write_status()
            _rotate_log(self.home, self.cfg.daemon.log_max_bytes)
        say(f"stopping: draining effects in flight (up to {self.cfg.daemon.drain_timeout_s:g} s)")


def run(home: Home) -> int:
    """The daemon's body, in this process (`daemon run`, `daemon start --foreground`)."""
    cfg = config_file.load(home.require().config)

    async def serve() -> int:
        return await Daemon(home, cfg).run()

    return asyncio.run(serve())
