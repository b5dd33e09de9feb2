"""The daemon process: one engine on one home, until SIGTERM; SIGHUP reloads the whole engine.

The engine runs the survival layer, the built-in rules, the layers config.json names and the
business layer of HOME/engine (when that fails to load, the engine runs without it and an
`error` event says why; a layer config.json names that is missing or broken stops the daemon
from starting). Once the engine holds the home and has opened its stores, the daemon writes
HOME/daemon.pid; it refreshes HOME/daemon.status.json every second; on SIGTERM it drains
effects in flight (up to `daemon.drain_timeout_s`), closes the engine and removes the pidfile.

A reload (SIGHUP; a promote, a rollback, or a rollback the survival layer made) builds a new
engine from config.json and HOME/engine first; if that fails the running engine carries on
and an `error` event (key engine:reload) says why. Otherwise the running engine is closed
(its effects in flight drain, or stay claimable) and the new one opens on the same home.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from pulse_cli import config as config_file
from pulse_cli.assembly import (
    NO_CODE,
    BrokenLayer,
    bound_host,
    build_engine,
    load_code,
    tick_source,
    uncommitted_note,
)
from pulse_cli.enginedir import GitEngineDirectory, RolledBack, reconcile
from pulse_cli.home import EXIT_STATE, DaemonStatus, Home
from pulse_cli.loader import EngineCode
from pulse_cli.output import now_ms
from pulse_core import Engine, EventDraft, HomeLocked, PulseError, wait_signal
from pulse_core import error_draft as core_error_draft
from pulse_core._homelock import open_private

STATUS_EVERY_S = 1.0
LOAD_KEY = "engine:load"
RELOAD_KEY = "engine:reload"


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
    fd = open_private(home.logfile, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    say(f"log rotated (previous part: {home.logfile.name}.1)")


def error_draft(key: str, exc: BaseException, file: Path, host: str) -> EventDraft:
    """The `error` event that records a failed load (engine:load) or reload (engine:reload),
    with the file (and line) it names and the original error type of broken engine code,
    on `host` (where engines of several hosts share the log)."""
    return core_error_draft(key, exc, {
        "type": getattr(exc, "error_type", type(exc).__name__),
        "file": str(getattr(exc, "file", file)), "line": getattr(exc, "line", None)},
        host=host)


class Daemon:
    """One home's daemon: its engine, its status file, its reactions to signals."""

    def __init__(self, home: Home, cfg: config_file.Config) -> None:
        self.home = home
        self.cfg = cfg
        self.code = NO_CODE
        self.pid = os.getpid()
        self.status = DaemonStatus(self.pid, "starting", now_ms(), now_ms(), cfg.instance)
        self._settings(cfg)
        self.directory = (GitEngineDirectory(home.root, store=cfg.store, host=bound_host(cfg),
                                             on_rollback=self._rolled_back)
                          if home.engine.is_dir() else None)
        self.problems: list[EventDraft] = []
        self.engine = self._first_engine()
        self._wake = asyncio.Event()
        self._requests: dict[str, str] = {}

    def _settings(self, cfg: config_file.Config) -> None:
        """Report the settings `daemon stop` and `status` need even when config.json breaks."""
        self.status.instance = cfg.instance
        self.status.drain_timeout_s = cfg.daemon.drain_timeout_s
        self.status.store = cfg.store or self.home.layout.store_url()

    def _build(self, cfg: config_file.Config, code: EngineCode) -> Engine:
        return build_engine(self.home.root, cfg, code, directory=self.directory)

    def _first_engine(self) -> Engine:
        """The engine with HOME/engine's code; without it if that code cannot run.

        A configured layer that cannot be built (BrokenLayer), or an engine that cannot be
        built even without the business code, is raised: the daemon does not start.
        """
        try:
            code = load_code(self.home.engine)
            if code.uncommitted:
                say(uncommitted_note(self.home.engine, code))
            engine = self._build(self.cfg, code)
        except BrokenLayer:
            raise
        except Exception as exc:  # broken business code must not stop the survival layer
            others = ", ".join(self.cfg.layers)
            only = f"survival rules and layers {others} only" if others else \
                "survival rules only"
            say(f"engine code in {self.home.engine} cannot run; {only}: {exc}")
            self.problems.append(error_draft(LOAD_KEY, exc, self.home.engine / "engine.py",
                                             bound_host(self.cfg)))
            code = NO_CODE
            engine = self._build(self.cfg, code)
        self.code = code
        self.status.revision = code.revision
        self.status.uncommitted = list(code.uncommitted)
        return engine

    def request(self, what: str, why: str = "") -> None:
        """Ask the main loop to `stop` or `reload` (called from signal handlers)."""
        self._requests.setdefault(what, why or what)
        self._wake.set()

    async def _rolled_back(self, done: RolledBack) -> None:
        # Called from inside the engine's rollback executor: the engine cannot close itself
        # there (it would wait for this very effect), so the main loop reloads it.
        self.request("reload", str(done))

    async def reload(self, why: str) -> None:
        """Build a new engine from config.json and HOME/engine and switch to it; if it cannot
        be built, the running engine carries on and an `error` event says why."""
        self.status.reloads += 1
        self.status.last_reload_at = now_ms()
        code: EngineCode | None = None
        try:
            cfg = config_file.load(self.home.config)
            code = await asyncio.to_thread(load_code, self.home.engine)
            if code.uncommitted:
                say(uncommitted_note(self.home.engine, code))
            engine = build_engine(self.home.root, cfg, code, directory=self.directory)
        except Exception as exc:  # whatever is wrong with the new code, the old engine runs on
            if code is not None:
                code.forget()
            say(f"{why}: reload failed, the previous engine keeps running: {exc}")
            file = self.home.config if isinstance(exc, config_file.ConfigError) else \
                self.home.engine / "engine.py"
            await self.engine.append([error_draft(RELOAD_KEY, exc, file, self.engine.placement)])
            self._write_status()
            return
        say(f"{why}: reloading: closing the running engine (draining effects in flight, up "
            f"to {self.cfg.daemon.drain_timeout_s:g} s)")
        self.status.state = "reloading"
        self._write_status()
        await self._switch(engine, cfg, code, why)

    async def _switch(self, engine: Engine, cfg: config_file.Config, code: EngineCode,
                      why: str) -> None:
        await self.engine.close()
        try:
            await engine.open()
            self.engine = engine
            await self._started()
        except Exception as exc:
            # The new engine cannot open its stores (a store URL that does not work, say) or
            # start: the settings that ran until now run again, and the log says why.
            say(f"{why}: the new engine did not start ({exc}); reopening the previous one")
            await engine.close()
            code.forget()
            self.engine = self._build(self.cfg, self.code)
            await self.engine.open()
            await self.engine.append([error_draft(RELOAD_KEY, exc, self.home.config,
                                                  self.engine.placement)])
            await self._started()
            say(f"{why}: kept the previous engine, revision {self.status.revision or 'none'}, "
                f"{len(self.engine.rule_names)} rules")
            return
        previous, self.cfg, self.code = self.code, cfg, code
        previous.forget()  # its engine is closed: its modules go
        self.status.revision = code.revision
        self.status.uncommitted = list(code.uncommitted)
        self._settings(cfg)
        say(f"{why}: reloaded, revision {self.status.revision or 'none'}, "
            f"{len(engine.rule_names)} rules, default tick {engine.default_tick_ms} ms (from "
            f"{tick_source(code, self.home.root)})")

    async def _started(self) -> None:
        if self.directory is not None:  # its rollbacks go in the running engine's log
            self.directory.events = self.engine.events
            self.directory.host = self.engine.placement
        await self.engine.start()
        self.status.state = "running"
        self._write_status()

    def _write_status(self) -> None:
        status = self.status
        status.ticks, status.last_tick_at = self.engine.ticks, self.engine.last_tick_at
        status.tick_ms, status.updated_at = self.engine.last_tick_ms, now_ms()
        self.home.write_status(status)

    async def run(self) -> int:
        """Serve until SIGTERM or SIGINT; exit code 3 if another engine holds the home."""
        loop = asyncio.get_running_loop()
        for signum, what in ((signal.SIGTERM, "stop"), (signal.SIGINT, "stop"),
                             (signal.SIGHUP, "reload")):
            loop.add_signal_handler(signum, self.request, what, signum.name)
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
        if self.problems:
            await self.engine.append(self.problems)
        try:  # a promote recorded whose main never moved: the log says what really runs
            await reconcile(self.home.root, self.engine.events, host=self.engine.placement,
                            origin="engine")
        except PulseError as exc:  # never a reason not to run the survival layer
            say(f"could not compare the log with main's revision: {exc}")
        await self._started()
        self.home.write_pidfile(self.pid)
        say(f"ready: home {self.home.root}, revision {self.status.revision or 'none'}, "
            f"{len(self.engine.rule_names)} rules, default tick {self.engine.default_tick_ms} "
            f"ms (from {tick_source(self.code, self.home.root)}); SIGTERM or Ctrl-C stops "
            "after draining")
        while "stop" not in self._requests:
            await wait_signal(self._wake, STATUS_EVERY_S)
            self._wake.clear()
            if "reload" in self._requests and "stop" not in self._requests:
                await self.reload(self._requests.pop("reload"))
            self._write_status()
            _rotate_log(self.home, self.cfg.daemon.log_max_bytes)
        say(f"stopping: draining effects in flight (up to {self.cfg.daemon.drain_timeout_s:g} s)")


def run(home: Home) -> int:
    """The daemon's body, in this process (`daemon run`, `daemon start --foreground`).

    Raises BrokenLayer (the daemon does not start) when a layer config.json names cannot be
    built.
    """
    cfg = config_file.load(home.require().config)

    async def serve() -> int:
        return await Daemon(home, cfg).run()

    return asyncio.run(serve())
