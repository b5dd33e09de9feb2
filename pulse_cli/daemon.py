"""The daemon process: one engine on one home, until SIGTERM; SIGHUP reloads the whole engine.

The engine runs the survival layer, the built-in rules, the layers config.json names and the
business layer of HOME/engine (when that fails to load, the engine runs without it and an
`error` event says why; a layer config.json names that is missing or broken stops the daemon
from starting). Once the engine holds the home and has opened its stores, the daemon writes
HOME/daemon.pid; it refreshes HOME/daemon.status.json every second (with each essential
process as supervisorctl shows it, the engine's loops and the last notices); on SIGTERM it
drains effects in flight (up to `daemon.drain_timeout_s`), closes the engine and removes the
pidfile. Its log (pulse_cli.daemon_log) says why each restart, give-up, rollback, notice and
reload happened; under systemd it speaks the notify protocol (pulse_cli.sd_notify).

A reload (SIGHUP; a promote, a rollback, or a rollback the survival layer made) builds a new
engine from config.json and HOME/engine first; if that fails the running engine carries on
and an `error` event (key engine:reload) says why. Otherwise the running engine is closed
(its effects in flight drain, or stay claimable) and the new one opens on the same home.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import IO

import msgspec

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
from pulse_cli.daemon_log import (
    DaemonLog,
    EventNarrator,
    LogRecords,
    LoopWatch,
    reload_cause,
    rotate_log,
)
from pulse_cli.enginedir import GitEngineDirectory, RolledBack, reconcile
from pulse_cli.home import EXIT_STATE, DaemonStatus, Home
from pulse_cli.loader import EngineCode
from pulse_cli.output import now_ms
from pulse_cli.sd_notify import SystemdNotifier
from pulse_core import (
    Engine,
    EventDraft,
    HomeLocked,
    PulseError,
    StoreError,
    wait_signal,
)
from pulse_core import error_draft as core_error_draft
from pulse_survival import ProcessState, process_states

STATUS_EVERY_S = 1.0
LOAD_KEY = "engine:load"
RELOAD_KEY = "engine:reload"
ROLLED_BACK = "rolled back"
"""How a reload the engine's own rollback asked for is requested (the reason follows)."""
STALL_GRACE_S = 30.0
"""Beyond the drain timeout, how long one turn of the main loop (a reload) may take before
the systemd watchdog is no longer served."""


def error_draft(key: str, exc: BaseException, file: Path, host: str) -> EventDraft:
    """The `error` event that records a failed load (engine:load) or reload (engine:reload),
    with the file (and line) it names and the original error type of broken engine code,
    on `host` (where engines of several hosts share the log)."""
    return core_error_draft(key, exc, {
        "type": getattr(exc, "error_type", type(exc).__name__),
        "file": str(getattr(exc, "file", file)), "line": getattr(exc, "line", None)},
        host=host)


class Daemon:
    """One home's daemon: its engine, its log, its status file, its reactions to signals."""

    def __init__(self, home: Home, cfg: config_file.Config, *, log: DaemonLog | None = None,
                 notifier: SystemdNotifier | None = None) -> None:
        self.home = home
        self.cfg = cfg
        self.log = log or DaemonLog(cfg.daemon.log_format)
        self.notifier = notifier or SystemdNotifier(None)
        self.code = NO_CODE
        self.pid = os.getpid()
        self.status = DaemonStatus(self.pid, "starting", now_ms(), now_ms(), cfg.instance)
        self._settings(cfg)
        self.directory = (GitEngineDirectory(home.root, store=cfg.store,
                                             host=bound_host(home.root, cfg),
                                             on_rollback=self._rolled_back)
                          if home.engine.is_dir() else None)
        self.problems: list[EventDraft] = []
        self.engine = self._first_engine()
        self.narrator = EventNarrator(self.log, 0)
        self.loops = LoopWatch(self.log)
        self.processes: list[ProcessState] = []
        self.loaded_seq = 0  # the log's head when the running engine was (re)loaded
        self._wake = asyncio.Event()
        self._requests: dict[str, str] = {}
        self._narrating: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._pidfile: IO[bytes] | None = None  # locked while open: the daemon runs
        self._beat = time.monotonic()

    def _settings(self, cfg: config_file.Config) -> None:
        """Report the settings `daemon stop` and `status` need even when config.json breaks,
        and write the log in the format `cfg` asks for."""
        self.status.instance = cfg.instance
        self.status.drain_timeout_s = cfg.daemon.drain_timeout_s
        self.status.store = cfg.store or self.home.layout.store_url()
        self.log.format = cfg.daemon.log_format

    def _build(self, cfg: config_file.Config, code: EngineCode) -> Engine:
        engine = build_engine(self.home.root, cfg, code, directory=self.directory)
        engine.revision = code.revision or ""  # what its heartbeats report
        return engine

    def _first_engine(self) -> Engine:
        """The engine with HOME/engine's code; without it if that code cannot run.

        A configured layer that cannot be built (BrokenLayer), or an engine that cannot be
        built even without the business code, is raised: the daemon does not start.
        """
        try:
            code = load_code(self.home.engine)
            if code.uncommitted:
                self.log.say(uncommitted_note(self.home.engine, code), event="uncommitted",
                             level="warning")
            engine = self._build(self.cfg, code)
        except BrokenLayer:
            raise
        except Exception as exc:  # broken business code must not stop the survival layer
            others = ", ".join(self.cfg.layers)
            only = f"survival rules and layers {others} only" if others else \
                "survival rules only"
            self.log.say(f"engine code in {self.home.engine} cannot run; {only}: {exc}",
                         event="engine-load-failed", level="error")
            self.problems.append(error_draft(LOAD_KEY, exc, self.home.engine / "engine.py",
                                             bound_host(self.home.root, self.cfg)))
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
        self.request("reload", f"{ROLLED_BACK}: {done}")

    async def _reason(self, why: str) -> str:
        """Why a reload was asked for: a signal, or a rollback made in this engine, told by
        the promote or rollback recorded since the running engine was loaded (`upulse
        promote` and `rollback` send SIGHUP; the rollback's reason is in its event)."""
        if why != signal.SIGHUP.name and not why.startswith(ROLLED_BACK):
            return why
        cause = await reload_cause(self.engine.events, self.engine.placement, self.loaded_seq)
        if cause is None:
            return why
        return f"the {cause}" if why.startswith(ROLLED_BACK) else f"{why} (after the {cause})"

    async def reload(self, why: str) -> None:
        """Build a new engine from config.json and HOME/engine and switch to it; if it cannot
        be built, the running engine carries on and an `error` event says why."""
        why = await self._reason(why)
        self.notifier.reloading(f"reloading: {why}")
        with contextlib.suppress(PulseError):
            self.loaded_seq = await self.engine.events.last_seq()
        self.status.reloads += 1
        self.status.last_reload_at = now_ms()
        code: EngineCode | None = None
        try:
            cfg = config_file.load(self.home.config)
            code = await asyncio.to_thread(load_code, self.home.engine)
            if code.uncommitted:
                self.log.say(uncommitted_note(self.home.engine, code), event="uncommitted",
                             level="warning")
            engine = build_engine(self.home.root, cfg, code, directory=self.directory)
        except Exception as exc:  # whatever is wrong with the new code, the old engine runs on
            if code is not None:
                code.forget()
            self.log.say(f"{why}: reload failed, the previous engine keeps running: {exc}",
                         event="reload-failed", level="error", reason=why, error=str(exc))
            file = self.home.config if isinstance(exc, config_file.ConfigError) else \
                self.home.engine / "engine.py"
            await self.engine.append([error_draft(RELOAD_KEY, exc, file, self.engine.placement)])
            self._write_status()
            self.notifier.ready(f"reload failed; running revision {self._revision()}")
            return
        self.log.say(f"{why}: reloading: closing the running engine (draining effects in "
                     f"flight, up to {self.cfg.daemon.drain_timeout_s:g} s)", event="reload",
                     reason=why)
        self.status.state = "reloading"
        self._write_status()
        await self._switch(engine, cfg, code, why)
        self.notifier.ready(f"running revision {self._revision()}")

    def _revision(self) -> str:
        return self.status.revision or "none"

    async def _switch(self, engine: Engine, cfg: config_file.Config, code: EngineCode,
                      why: str) -> None:
        await self._stop_narrating()
        await self.engine.close()
        try:
            await engine.open()
            self.engine = engine
            await self._started()
        except Exception as exc:
            # The new engine cannot open its stores (a store URL that does not work, say) or
            # start: the settings that ran until now run again, and the log says why.
            self.log.say(f"{why}: the new engine did not start ({exc}); reopening the "
                         "previous one", event="reload-failed", level="error", reason=why,
                         error=str(exc))
            await engine.close()
            code.forget()
            self.engine = self._build(self.cfg, self.code)
            await self.engine.open()
            await self.engine.append([error_draft(RELOAD_KEY, exc, self.home.config,
                                                  self.engine.placement)])
            await self._started()
            self.log.say(f"{why}: kept the previous engine, revision {self._revision()}, "
                         f"{len(self.engine.rule_names)} rules", event="reload", reason=why,
                         revision=self.status.revision)
            return
        previous, self.cfg, self.code = self.code, cfg, code
        previous.forget()  # its engine is closed: its modules go
        self.status.revision = code.revision
        self.status.uncommitted = list(code.uncommitted)
        self._settings(cfg)
        self.log.say(f"{why}: reloaded, revision {self._revision()}, "
                     f"{len(engine.rule_names)} rules, default tick {engine.default_tick_ms} "
                     f"ms (from {tick_source(code, self.home.root)})", event="reloaded",
                     reason=why, revision=self.status.revision)

    async def _started(self) -> None:
        if self.directory is not None:  # its rollbacks go in the running engine's log
            self.directory.events = self.engine.events
            self.directory.host = self.engine.placement
        await self.engine.start()
        self.loops.reset()  # a new engine's loops count their restarts from 0
        self.narrator.host = self.engine.placement
        self._narrating = asyncio.create_task(self.narrator.follow(self.engine.events),
                                              name="upulse-narrator")
        self._narrating.add_done_callback(self._narration_ended)
        self.status.state = "running"
        await self._observe()
        self._write_status()

    def _narration_ended(self, task: asyncio.Task[None]) -> None:
        """Say so when the narration of the log ended by itself (it never should)."""
        if not task.cancelled() and task.exception() is not None:
            self.log.say(f"daemon.log no longer narrates the event log: "
                         f"{type(task.exception()).__name__}: {task.exception()}",
                         event="narration-ended", level="error")

    async def _stop_narrating(self) -> None:
        task, self._narrating = self._narrating, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # how it ended was said by _narration_ended

    async def _observe(self) -> None:
        """Look at the running engine: its processes' states, and its loops (a line for
        each restart)."""
        self.loops.look(self.engine.loops())
        try:
            self.processes = await process_states(self.engine)
        except Exception as exc:  # the store is down, say: the last states stand
            self.log.say(f"cannot read the essential processes' states: "
                         f"{type(exc).__name__}: {exc}", event="processes-unreadable",
                         level="error")

    def _write_status(self) -> None:
        status, engine = self.status, self.engine
        status.ticks, status.last_tick_at = engine.ticks, engine.last_tick_at
        status.tick_ms, status.updated_at = engine.last_tick_ms, now_ms()
        status.next_tick_at = engine.next_tick_at
        status.processes = [msgspec.to_builtins(p) for p in self.processes]
        status.loops = engine.loops()
        status.notices = list(self.narrator.notices)
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
            self.log.say(f"not started: {exc}", event="not-started", level="error")
            return EXIT_STATE
        try:
            self.narrator.after_seq = await self.engine.events.last_seq()
            with contextlib.suppress(StoreError):  # notices of before are a nicety
                await self.narrator.seed_notices(self.engine.events)
            await self._serve()
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()
            await self._stop_narrating()
            await self.engine.close()
            if self._pidfile is not None:
                self._pidfile.close()
            self.home.remove_pidfile(self.pid)
            self.status.state, self.status.stopped_at = "stopped", now_ms()
            self._write_status()
        self.log.say("stopped", event="stopped")
        self.log.flush(everything=True)
        return 0

    async def _serve_watchdog(self, every_s: float) -> None:
        """WATCHDOG=1 every `every_s` from READY=1 on, while the main loop turns (a turn that
        takes longer than any reload may means it hangs: systemd then restarts the daemon)."""
        limit = STATUS_EVERY_S + self.cfg.daemon.drain_timeout_s + STALL_GRACE_S
        while True:
            if time.monotonic() - self._beat <= limit:
                self.notifier.watchdog()
            await asyncio.sleep(every_s)

    async def _serve(self) -> None:
        if self.problems:
            await self.engine.append(self.problems)
        try:  # a promote recorded whose main never moved: the log says what really runs
            await reconcile(self.home.root, self.engine.events, host=self.engine.placement,
                            origin="engine")
        except PulseError as exc:  # never a reason not to run the survival layer
            self.log.say(f"could not compare the log with main's revision: {exc}",
                         event="reconcile-failed", level="warning")
        self.loaded_seq = await self.engine.events.last_seq()
        await self._started()
        self._pidfile = self.home.write_pidfile(self.pid)
        ready = (f"ready: home {self.home.root}, revision {self._revision()}, "
                 f"{len(self.engine.rule_names)} rules, default tick "
                 f"{self.engine.default_tick_ms} ms")
        self.log.say(f"{ready} (from {tick_source(self.code, self.home.root)}); SIGTERM or "
                     "Ctrl-C stops after draining", event="ready", revision=self.status.revision)
        self.notifier.ready(ready)
        if self.notifier.watchdog_s is not None:  # systemd watches from READY=1 on
            self._watchdog = asyncio.create_task(self._serve_watchdog(self.notifier.watchdog_s))
        while "stop" not in self._requests:
            await wait_signal(self._wake, STATUS_EVERY_S)
            self._wake.clear()
            self._beat = time.monotonic()
            if "reload" in self._requests and "stop" not in self._requests:
                await self.reload(self._requests.pop("reload"))
            await self._observe()
            self._write_status()
            self.log.flush()
            rotate_log(self.home, self.cfg.daemon.log_max_bytes, self.log)
        stopping = (f"stopping: draining effects in flight (up to "
                    f"{self.cfg.daemon.drain_timeout_s:g} s)")
        self.notifier.stopping(stopping)
        self.log.say(stopping, event="stopping", reason=self._requests["stop"])


def run(home: Home) -> int:
    """The daemon's body, in this process (`daemon run`, `daemon start --foreground`).

    Raises BrokenLayer (the daemon does not start) when a layer config.json names cannot be
    built. Under systemd (with $NOTIFY_SOCKET) it notifies READY=1, RELOADING=1, WATCHDOG=1
    and STOPPING=1; the warnings of the `pulse` logger go to its log, in its format.
    """
    cfg = config_file.load(home.require().config)
    log = DaemonLog(cfg.daemon.log_format)
    notifier = SystemdNotifier.from_environment()
    records = LogRecords(log)
    pulse_logger = logging.getLogger("pulse")
    pulse_logger.addHandler(records)

    async def serve() -> int:
        return await Daemon(home, cfg, log=log, notifier=notifier).run()

    try:
        return asyncio.run(serve())
    finally:
        pulse_logger.removeHandler(records)
