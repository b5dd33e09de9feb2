"""Faults of the `upulse` command and of the home on disk: hostile text, file modes, homes
this user may only read, permission problems, a crashed daemon's files, a broken config.json.

Every `upulse` here is a real process. A home "this user may only read" is made with chmod;
as root, whom modes do not stop, the command runs as root without CAP_DAC_OVERRIDE (dropped
from its bounding set before exec), which modes do stop: `refuses_writes` proves it first.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from pulse_cli.config import write_default
from pulse_core import Engine, EventDraft, open_home
from pulse_core._effects import effect_draft
from pulse_survival import Notify
from tests.cli.runner import Upulse, daemon_pid
from tests.cli.support import child_env

TEST_TIME_LIMIT_S = 60
PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE = 1
HOSTILE = "\x1b]0;pwned\x07\x1b[2J"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J"


@pytest.fixture
def upulse(tmp_path: Path) -> Iterator[Upulse]:
    """`upulse` as a subprocess; daemons it left running are stopped afterwards."""
    runner = Upulse(tmp_path)
    try:
        yield runner
    finally:
        runner.stop_all()


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def _without_dac_override() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE)")


def bound_by_modes(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `argv` as a process file modes bind: this user, or root without CAP_DAC_OVERRIDE."""
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=30, check=False,
        stdin=subprocess.DEVNULL,
        preexec_fn=_without_dac_override if os.geteuid() == 0 else None)


def upulse_bound_by_modes(upulse: Upulse, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return bound_by_modes([sys.executable, "-m", "pulse_cli", *map(str, args)], upulse.env)


def refuses_writes(folder: Path) -> None:
    """Fail the test unless a process started like the commands cannot create in `folder`."""
    probe = bound_by_modes([sys.executable, "-c", f"open({str(folder / 'probe')!r}, 'x')"],
                           child_env())
    assert probe.returncode != 0 and "PermissionError" in probe.stderr, (
        f"a process bound by modes could write in {folder} — this root cannot drop "
        "CAP_DAC_OVERRIDE here (no CAP_SETPCAP?); run the fault suite as a normal user")


def read_only(home: Path) -> None:
    """Make `home` and its files read-only for their owner (folders 0500, files 0400)."""
    for path in sorted(home.rglob("*"), reverse=True):
        path.chmod(0o500 if path.is_dir() else 0o400)
    home.chmod(0o500)


def writable(home: Path) -> None:
    """Undo read_only, so pytest can delete the folder."""
    home.chmod(0o700)
    for path in home.rglob("*"):
        path.chmod(0o700 if path.is_dir() else 0o600)


def notice(text: str, key: str = "cli-test", origin: str = "human") -> EventDraft:
    return EventDraft("notification", key, {"text": text}, origin=origin)


CRASHING_WRITER = """
import asyncio, os, signal, sys
import pulse_survival  # registers the notification kind
from pulse_core import EventDraft, open_home

async def main() -> None:
    stores = await open_home(sys.argv[1])
    await stores.events.append([EventDraft("notification", "crash", {"text": "in the wal"},
                                           origin="human")])
    await stores.vitals.record("load", {"per_core": 0.5})
    await stores.side.put("quiet", {"hold": b"1"})
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


async def crashed_home(home: Path) -> Path:
    """A home whose writer was killed (SIGKILL) after committing: events.db holds one
    checkpointed event, and events.db-wal (with its -shm) the newer one."""
    await asyncio.to_thread(home_with, home)
    stores = await open_home(home)
    await stores.events.append([notice("checkpointed")])
    await stores.close()  # the last connection checkpoints the -wal into events.db
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", CRASHING_WRITER, str(home)], env=child_env(),
        capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert (home / "events.db-wal").stat().st_size > 0 and (home / "events.db-shm").exists()
    return home


def files_of(home: Path) -> dict[str, tuple[str, int, int]]:
    """Every file of `home`: its hash, size and modification time."""
    return {str(p.relative_to(home)): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                       p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(home.rglob("*")) if p.is_file()}


def home_with(home: Path) -> Path:
    """A home as `upulse init` lays it out for the queries (config.json), without git."""
    home.mkdir(mode=0o700)
    write_default(home / "config.json", "default")
    return home


# -- 7: control characters ----------------------------------------------------------------


async def test_titles_keys_origins_and_errors_print_control_characters_escaped(
        upulse: Upulse, tmp_path: Path) -> None:
    """Fault 7: `upulse tasks` and `upulse events` printed titles, keys and origins raw, so
    terminal escape sequences in the log reached the operator's terminal."""
    home = await asyncio.to_thread(home_with, tmp_path / "home")
    failing = effect_draft(Notify(topic="t", level="info", text="x"), origin="agent")
    stores = await open_home(home)
    try:
        await stores.events.append([
            notice(f"text {HOSTILE}", key=f"key {HOSTILE}", origin=f"rule:{HOSTILE}"),
            EventDraft("task-created", f"t{HOSTILE}", {"title": f"title {HOSTILE}"}),
            failing,
            EventDraft("effect-failed", failing.key, {"attempt": 1, "final": True,
                                                      "error": f"refused {HOSTILE}"}),
            EventDraft("error", "rule:x", {"type": "Boom", "message": f"said {HOSTILE}"},
                       origin="engine"),
        ])
        await stores.vitals.record("load", error=f"cannot read {HOSTILE}")
    finally:
        await stores.close()
    shown = [upulse(command, "--home", home).stdout
             for command in ("events", "tasks", "effects", "vitals")]
    shown.append(upulse("daemon", "status", "--home", home, ok=False).stdout)
    refused = upulse("events", "--home", tmp_path / f"nowhere {HOSTILE}", ok=False)
    assert refused.returncode == 1
    shown.append(refused.stderr)
    for text in shown:
        assert "\x1b" not in text and "\x07" not in text, text
    events, tasks, effects, vitals, status, error = shown
    assert f"key {SHOWN}" in events and f"rule:{SHOWN}" in events
    assert f"title {SHOWN}" in tasks and f"t{SHOWN}" in tasks
    assert f"refused {SHOWN}" in effects
    assert f"cannot read {SHOWN}" in vitals
    assert f"said {SHOWN}" in status
    assert f"nowhere {SHOWN} is not a pulse home" in error


# -- 8: file modes --------------------------------------------------------------------------


def private(path: Path) -> bool:
    mode = stat.S_IMODE(path.stat().st_mode)
    return mode == (0o700 if path.is_dir() else 0o600)


def loose_paths(home: Path) -> list[str]:
    """What pulse made in `home` that others may use (git's engine/ and staging/ aside)."""
    made = [home, *(p for p in home.rglob("*")
                    if not {"engine", "staging"} & set(p.relative_to(home).parts))]
    return [f"{p} {stat.S_IMODE(p.stat().st_mode):04o}" for p in made if not private(p)]


def test_init_and_the_daemon_make_a_home_only_its_owner_can_read(
        upulse: Upulse, tmp_path: Path) -> None:
    """Fault 8: homes were created world-readable (0755 folder, 0644 config.json, events.db,
    daemon.log) though they hold webhook URLs, process environments and the agent's memory."""
    home = tmp_path / "home"
    with umask(0o022):
        upulse.init(home)
        upulse("daemon", "start", "--home", home)
        upulse("task", "create", "t-1", "--title", "while it runs", "--home", home)
        names = {p.name for p in home.iterdir()}
        assert {"events.db-wal", "events.db-shm", "daemon.pid", "engine.lock"} <= names
        assert loose_paths(home) == []
        upulse("daemon", "stop", "--home", home)
    assert {"daemon.log", "daemon.status.json", "checkpoints", "objects", "logs"} <= {
        p.name for p in home.iterdir()}
    assert loose_paths(home) == []
    with umask(0o022):
        upulse("init", "--instance", "blue")  # the base home and instances/ are made too
    assert (upulse.base / "instances" / "blue" / "events.db").is_file()
    assert loose_paths(upulse.base) == []


async def test_an_embedded_engine_makes_its_home_only_its_owner_can_read(
        tmp_path: Path) -> None:
    """Fault 8: an embedded Engine created its home, stores and checkpoints with the umask's
    modes (0755, 0644)."""
    home = tmp_path / "home"
    with umask(0o022):
        engine = Engine(home)
        await engine.open()
        try:
            await engine.events.append([notice("hello")])
            big = notice("with a payload")  # objects/ab/ and its file
            await engine.events.append([msgspec.structs.replace(big, attachment=b"x" * 100)])
            assert (home / "events.db-wal").exists() and any((home / "objects").iterdir())
            assert loose_paths(home) == []
        finally:
            await engine.close()
    assert (home / "checkpoints").is_dir() and any((home / "checkpoints").iterdir())
    assert loose_paths(home) == []
    shutil.rmtree(home / "checkpoints")  # deleted by hand: made private again on the way out
    with umask(0o022):
        engine = Engine(home)
        await engine.open()
        await engine.close()
    assert loose_paths(home) == []


async def test_a_home_open_to_others_is_warned_about_and_left_as_it_is(
        upulse: Upulse, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Fault 8: a home others may read gets a warning (on the CLI's stderr; the `pulse`
    logger, so daemon.log, for an engine), and its modes are not changed behind its back."""
    home = await asyncio.to_thread(home_with, tmp_path / "home")
    home.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="pulse"):
        engine = Engine(home)
        await engine.open()
        await engine.close()
    assert f"{home} is open to other users (mode 0755)" in caplog.text
    done = upulse("events", "--home", home)
    assert f"upulse: warning: {home} is open to other users (mode 0755)" in done.stderr
    assert "chmod 700" in done.stderr
    assert stat.S_IMODE(home.stat().st_mode) == 0o755
    home.chmod(0o700)
    assert "warning" not in upulse("events", "--home", home).stderr


# -- 16 and 21: read-only commands on homes they may only read, after a crash --------------


async def test_read_only_commands_leave_a_crashed_daemons_files_byte_for_byte(
        upulse: Upulse, tmp_path: Path) -> None:
    """Fault 21: after a crashed daemon, `upulse events` and the other read-only commands
    wrote the live home (SQLite recovered the -shm in place; a checkpoint could follow)."""
    home = await crashed_home(tmp_path / "home")
    before = files_of(home)
    listed = upulse.json("events", "--home", home)
    assert [e["data"]["text"] for e in listed] == ["checkpointed", "in the wal"]  # type: ignore
    for command in ("tasks", "effects", "vitals"):
        upulse(command, "--home", home)
    status = upulse("daemon", "status", "--home", home, ok=False)
    assert status.returncode == 3 and "pending   0 effects" in status.stdout
    assert files_of(home) == before


async def test_read_only_commands_read_a_home_this_user_may_only_read(
        upulse: Upulse, tmp_path: Path) -> None:
    """Fault 16: `upulse events/tasks/effects/daemon status` could not read a home the caller
    may only read (another user's, a read-only mount, a copy without its -shm)."""
    crashed = await crashed_home(tmp_path / "crashed")
    whole = tmp_path / "whole"  # with -wal and -shm, as the crash left them
    without_shm = tmp_path / "without-shm"  # a copy that left the -shm files out
    shutil.copytree(crashed, whole)
    shutil.copytree(crashed, without_shm, ignore=shutil.ignore_patterns("*-shm"))
    try:
        for home in (whole, without_shm):
            read_only(home)
        refuses_writes(whole)
        before = {home: files_of(home) for home in (whole, without_shm)}
        for home, commands in ((whole, ("tasks", "effects", "vitals")), (without_shm, ())):
            for command in commands:
                done = upulse_bound_by_modes(upulse, command, "--home", home)
                assert done.returncode == 0, (command, done.stderr)
            status = upulse_bound_by_modes(upulse, "daemon", "status", "--home", home)
            assert status.returncode == 3 and "pending   0 effects" in status.stdout
        texts = {}
        for home in (whole, without_shm):
            done = upulse_bound_by_modes(upulse, "events", "--json", "--home", home)
            texts[home] = ([e["data"]["text"] for e in json.loads(done.stdout)], done.stderr)
        assert texts[whole] == (["checkpointed", "in the wal"], "")
        shown, warned = texts[without_shm]
        assert shown == ["checkpointed"]  # what is only in the -wal cannot be read here
        assert f"{without_shm / 'events.db'}: read without events.db-wal" in warned
        assert {home: files_of(home) for home in (whole, without_shm)} == before
    finally:
        for home in (whole, without_shm):
            writable(home)


# -- 17: permission problems ---------------------------------------------------------------


ENGINE_OPEN = """
import asyncio, sys
from pulse_core import Engine, PulseError

async def main() -> None:
    try:
        await Engine(sys.argv[1]).open()
    except PulseError as exc:
        print(f"{type(exc).__name__}: {exc}")

asyncio.run(main())
"""


def test_init_and_daemon_start_on_a_home_this_user_cannot_write_say_what_to_fix(
        upulse: Upulse, tmp_path: Path) -> None:
    """Fault 17: `init` and `daemon start` on a home this user may not write ended in raw
    PermissionError tracebacks."""
    home = home_with(tmp_path / "home")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    try:
        read_only(home)
        read_only(fresh)
        refuses_writes(fresh)
        for args, path in ((["init", "--home", fresh], fresh / "config.json"),
                           (["daemon", "start", "--home", home], home / "daemon.log")):
            done = upulse_bound_by_modes(upulse, *args)
            assert done.returncode == 1, done
            assert "Traceback" not in done.stderr
            assert f"{path}: permission denied" in done.stderr and "owner" in done.stderr
    finally:
        writable(home)
        writable(fresh)


def test_engine_open_on_a_home_this_user_cannot_write_raises_a_typed_error(
        tmp_path: Path) -> None:
    """Fault 17: Engine.open raised a bare PermissionError for engine.lock and objects/."""
    no_lock = tmp_path / "no-lock"  # the lock cannot be created
    no_objects = tmp_path / "no-objects"  # the lock can be taken, objects/ cannot be made
    no_lock.mkdir()
    no_objects.mkdir()
    (no_objects / "engine.lock").write_text("")
    try:
        for home in (no_lock, no_objects):
            home.chmod(0o500)
        refuses_writes(no_lock)
        for home, path in ((no_lock, "engine.lock"), (no_objects, "objects")):
            done = bound_by_modes([sys.executable, "-c", ENGINE_OPEN, str(home)], child_env())
            assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
            assert done.stdout.startswith(f"HomePermissionDenied: {home / path}: permission "
                                          "denied"), done.stdout
    finally:
        for home in (no_lock, no_objects):
            home.chmod(0o700)


# -- 18 and 25: a broken config.json -------------------------------------------------------


def test_a_deeply_nested_config_is_a_config_error(upulse: Upulse, tmp_path: Path) -> None:
    """Fault 18: a deeply nested config.json raised a bare RecursionError."""
    home = home_with(tmp_path / "home")
    for deep in ("[" * 100_000, '{"layers": {"x": ' + "[" * 200 + "]" * 200 + "}}"):
        (home / "config.json").write_text(deep)
        done = upulse("events", "--home", home, ok=False)
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert "levels deep" in done.stderr and "config.json" in done.stderr


def test_a_broken_config_does_not_lock_the_operator_out_of_a_running_daemon(
        upulse: Upulse, tmp_path: Path) -> None:
    """Fault 25: with a broken config.json, `daemon stop`, `status` and `restart` all refused
    a running daemon; JSON errors gave no line or column."""
    home = upulse.init(tmp_path / "home")
    upulse("daemon", "start", "--home", home)
    pid = daemon_pid(home)
    assert pid is not None
    (home / "config.json").write_text('{\n  "daemon": {\n    "drain_timeout_s": 3,\n  }\n}\n')
    status = upulse("daemon", "status", "--home", home)
    assert f"running (pid {pid})" in status.stdout
    assert "not valid JSON at line 4, column 3" in status.stdout
    assert "pending   0 effects" in status.stdout  # the log the daemon reported it uses
    report = upulse.json("daemon", "status", "--home", home)
    assert isinstance(report, dict) and report["running"] is True
    assert "line 4, column 3" in report["config_error"]
    restart = upulse("daemon", "restart", "--home", home, ok=False)
    assert restart.returncode == 1
    assert f"restart refused, the daemon (pid {pid}) was left running" in restart.stderr
    assert "line 4, column 3" in restart.stderr
    assert daemon_pid(home) == pid
    stopped = upulse("daemon", "stop", "--home", home)
    assert f"daemon stopped (was pid {pid})" in stopped.stdout
    assert daemon_pid(home) is None


def test_broken_json_in_any_command_names_the_line_and_column(
        upulse: Upulse, tmp_path: Path) -> None:
    """Fault 25: a config.json that is not JSON was reported without a line or column."""
    home = home_with(tmp_path / "home")
    (home / "config.json").write_text('{\n  "instance": "default",\n  "layers": {,}\n}\n')
    done = upulse("events", "--home", home, ok=False)
    assert done.returncode == 1
    assert "config.json: not valid JSON at line 3, column 14" in done.stderr
