"""Homes and named instances: where each engine keeps its files, and whether its daemon runs.

A home holds one engine's whole state. The files the engine owns (its stores, checkpoints,
logs and lock) are named by pulse_core._home.HomeLayout; the CLI adds its own::

    HOME/
    ├── config.json          settings, validated on load (pulse_cli.config)
    ├── engine/              the engine directory (git; main = production)
    ├── staging/             a git worktree of engine/ on the staging branch
    ├── daemon.pid           written once the daemon's engine is open, locked by it until stop
    ├── daemon.status.json   refreshed by the daemon every second (DaemonStatus)
    ├── daemon.log           the daemon's stdout and stderr
    ├── host.id              the home's host name when config.json's is null (config.home_host)
    └── (HomeLayout's files)

`--home DIR` names a home; `--instance NAME` is `BASE/instances/NAME`; without either the
home is BASE itself, where BASE is $UPULSE_HOME or ~/.upulse. Two instances are two homes, so
they never share a database, a lock or a pidfile.

What pulse creates in a home is its owner's only (folders 0700, files 0600; see
pulse_core._homelock), whatever the umask.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import msgspec
import psutil

from pulse_core import HomeLayout, HomeLocked, LoopStatus, PulseError, lock_home, write_private

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_STATE = 3
EXIT_REFUSED = 4

_INSTANCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class CliError(PulseError):
    """A command failed; `exit_code` is what the `upulse` process exits with."""

    exit_code = EXIT_ERROR


class UsageError(CliError):
    """The command line names something impossible (a bad instance name, bad JSON)."""

    exit_code = EXIT_USAGE


class NotInitialised(CliError):
    """The home has no config.json: `upulse init` was never run there, and the command needs
    what init adds (the settings, the engine directory)."""


class NotAHome(CliError):
    """The folder holds no event log and no config.json: no engine ever wrote there."""


class DaemonStateError(CliError):
    """The daemon is already running (for start) or not running (for stop, status)."""

    exit_code = EXIT_STATE


def base_home() -> Path:
    """$UPULSE_HOME, else ~/.upulse."""
    return Path(os.environ.get("UPULSE_HOME") or Path.home() / ".upulse").expanduser()


def is_instance_name(name: str) -> bool:
    """Whether `name` can name an instance (and its folder)."""
    return _INSTANCE_NAME.match(name) is not None


def check_instance_name(name: str) -> str:
    """`name` if it can name an instance folder, else UsageError saying what is allowed."""
    if not is_instance_name(name):
        raise UsageError(
            f"instance name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with "
            "a letter or digit"
        )
    return name


def resolve_home(home: Path | None, instance: str | None) -> Path:
    """The home a command acts on: `--home`, else `--instance`, else the base home."""
    if home is not None and instance is not None:
        raise UsageError("give --home or --instance, not both")
    if home is not None:
        return home.expanduser().absolute()
    if instance is not None:
        return base_home().absolute() / "instances" / check_instance_name(instance)
    return base_home().absolute()


class Notice(msgspec.Struct, frozen=True):
    """A `notification` the daemon saw in the log: when (ms), its topic, level and text."""

    ts: int
    topic: str
    level: str
    text: str


class DaemonStatus(msgspec.Struct):
    """HOME/daemon.status.json: what `upulse daemon status` shows besides the log, and what
    `daemon stop` and `status` need of the running daemon's settings (its drain timeout, the
    store URL of its log) when config.json cannot be read.

    `processes` holds each essential process as `pulse_survival.ProcessState` builtins (kept
    untyped here so that reading the file needs no survival layer), `loops` the engine's
    supervised loops, `notices` the last NOTICES_KEPT notifications, newest last, and
    `next_tick_at` when the next tick is due (ms; None before the first).
    """

    pid: int
    state: str
    started_at: int
    updated_at: int
    instance: str
    revision: str | None = None
    uncommitted: list[str] = []
    ticks: int = 0
    last_tick_at: int | None = None
    tick_ms: int | None = None
    reloads: int = 0
    last_reload_at: int | None = None
    stopped_at: int | None = None
    drain_timeout_s: float | None = None
    store: str | None = None
    next_tick_at: int | None = None
    processes: list[dict[str, Any]] = []
    loops: list[LoopStatus] = []
    notices: list[Notice] = []


NOTICES_KEPT = 10
"""How many of the latest notifications daemon.status.json keeps."""


class Home:
    """The paths of one home folder: the engine's files in `layout`, the CLI's own here."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.layout = HomeLayout(root)
        self.config = root / "config.json"
        self.engine = root / "engine"
        self.staging = root / "staging"
        self.pidfile = root / "daemon.pid"
        self.statusfile = root / "daemon.status.json"
        self.logfile = root / "daemon.log"

    def __repr__(self) -> str:
        return f"Home({str(self.root)!r})"

    @property
    def initialised(self) -> bool:
        """Whether `upulse init` laid this home out (its config.json names the event log)."""
        return self.config.is_file()

    def readable(self) -> Home:
        """This home if an engine keeps its log here (config.json or events.db): the daemon's,
        an embedded `Engine`'s or the demo's alike; else NotAHome. What the read-only
        commands need, and the task commands."""
        if not (self.initialised or self.layout.events_db.is_file()):
            raise NotAHome(
                f"{self.root} is not a pulse home: it has no events.db (and no config.json) — "
                "give --home the folder an engine writes to, or --instance NAME "
                "(`upulse instances` lists them)"
            )
        return self

    def require(self) -> Home:
        """This home if `upulse init` laid it out (config.json), else NotInitialised saying
        what init adds and keeps: what the daemon and the commands that move code need."""
        if not self.initialised:
            adds = ["config.json"]
            if not self.layout.events_db.is_file():
                adds.append("the stores (events.db, vitals.db, state.db, objects/)")
            adds += [f"{name} ({what})" for name, what, path in (
                ("engine/", "the engine directory, git, branch main", self.engine),
                ("staging/", "its worktree, where code is edited", self.staging))
                if not path.exists()]
            keeps = ("; it keeps events.db and everything else there as it is"
                     if self.layout.events_db.is_file() else "")
            listed = ", ".join(adds[:-1]) + f" and {adds[-1]}" if len(adds) > 1 else adds[0]
            raise NotInitialised(
                f"{self.root} has no config.json, which this command needs — "
                f"`upulse init --home {self.root}` adds {listed}{keeps}"
            )
        return self

    def running_pid(self) -> int | None:
        """The pid of this home's daemon if it is alive, else None (a stale pidfile is ignored).

        The process must exist and not be a zombie, and either hold a lock on the pidfile
        (as the daemon does for its whole life, reloads included) or on this home's
        engine.lock, or have started before the pidfile was written, so a recycled pid is
        not mistaken for the daemon. The locks are asked first because they read no clock: a
        step of the wall clock since the pidfile was written moves the start psutil reports,
        not the file's time.
        """
        found = _live_pid(self.pidfile, (self.pidfile, self.layout.lock))
        return None if found is None else found[0]

    def engine_pid(self) -> int | None:
        """The pid of the process whose engine holds this home's engine.lock (the daemon's,
        or an embedded `Engine`'s), else None. Read without taking the lock, so that an
        engine starting meanwhile is never refused: the pid the holder wrote in the lock
        must be alive and hold a lock on that file; where /proc/locks cannot be read, it
        must have started before it wrote the pid."""
        found = _live_pid(self.layout.lock, (self.layout.lock,), must_hold=True)
        return None if found is None else found[0]

    @contextlib.contextmanager
    def held(self, refused: str) -> Iterator[None]:
        """The home lock, held for the block; DaemonStateError (exit 3) when the daemon or
        another engine holds the home, saying `refused` ("migrate refused") and whose it is."""
        try:
            lock: IO[str] = lock_home(self.root)
        except HomeLocked as exc:
            pid = self.running_pid()
            who = f"the daemon (pid {pid})" if pid is not None else "another engine"
            raise DaemonStateError(
                f"{refused}: {who} has {self.root} open — `upulse daemon stop` first (the lock "
                f"says: {exc})") from None
        try:
            yield
        finally:
            lock.close()

    def daemon_status(self) -> DaemonStatus | None:
        """What the daemon last wrote to daemon.status.json (None: nothing readable)."""
        try:
            return msgspec.json.decode(self.statusfile.read_bytes(), type=DaemonStatus)
        except (OSError, msgspec.DecodeError):
            return None

    def write_pidfile(self, pid: int) -> IO[bytes]:
        """Write the pidfile atomically (a reader never sees it half written) and take a
        shared lock on it, held while the returned file stays open: the daemon keeps it open
        for its life, so `running_pid` knows it by its lock, with no clock read, even while a
        reload has let go of engine.lock. Close it when stopping."""
        write_private(self.pidfile, f"{pid}\n".encode())
        held = self.pidfile.open("rb")
        with contextlib.suppress(OSError):  # no locks here: the start time still tells
            fcntl.flock(held, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return held

    def write_status(self, status: DaemonStatus) -> None:
        """Write daemon.status.json atomically."""
        write_private(self.statusfile, msgspec.json.encode(status))

    def remove_pidfile(self, pid: int) -> None:
        """Remove the pidfile if it still names `pid` (never another daemon's)."""
        with contextlib.suppress(OSError):
            if self.pidfile.read_text().strip() == str(pid):
                self.pidfile.unlink()


def _holds_lock(pid: int, locks: Sequence[Path]) -> bool | None:
    """Whether /proc/locks lists a lock of `pid` on one of the files `locks` (None where
    none of them, or /proc/locks, can be read)."""
    inodes: set[str] = set()
    for lock in locks:
        with contextlib.suppress(OSError):
            inodes.add(str(lock.stat().st_ino))
    if not inodes:
        return None
    try:
        with open("/proc/locks") as listed:
            lines = listed.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[4] == str(pid) and fields[5].rsplit(":", 1)[-1] in inodes:
            return True
    return False


def list_homes(base: Path | None = None) -> list[tuple[str, Home]]:
    """The base home (named "default") and every instance under BASE/instances, by name."""
    root = (base or base_home()).absolute()
    homes = [("default", Home(root))]
    folder = root / "instances"
    if folder.is_dir():
        homes += [(p.name, Home(p)) for p in sorted(folder.iterdir())
                  if p.is_dir() and is_instance_name(p.name)]
    return homes


def _live_pid(path: Path, locks: Sequence[Path], *,
              must_hold: bool = False) -> tuple[int, os.stat_result] | None:
    """The pid written in `path` and the file's stat, when that process is alive, is no
    zombie and is the one that wrote it (a recycled pid is not it): it holds a lock on one
    of `locks`, or (unless `must_hold`, where /proc/locks can be read) it started before the
    file was written. The second test reads the wall clock twice, psutil's start and the
    file's time, so a step of the clock in between can fail it; the first reads none."""
    try:
        text = path.read_text().strip()
        info = path.stat()
    except OSError:
        return None
    if not text.isdigit():
        return None
    pid = int(text)
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        holds = _holds_lock(pid, locks)
        if holds:
            return pid, info
        if (holds is None or not must_hold) and process.create_time() <= info.st_mtime + 1:
            return pid, info
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    return None
