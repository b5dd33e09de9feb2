"""`upulse doctor`: whether this machine has everything promote and the daemon need.

It checks, and lists every problem in one message: git on PATH, mypy and pytest for this
interpreter (the promote gate runs them), exactly one survival layer installed (the daemon
refuses to run without it), and a home it can write (or create). When the home's config.json
names an event log or a side store on a server (PostgreSQL, Redis, Valkey), it checks that
each answers, read-only: it writes nothing there.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import sys
from pathlib import Path

import msgspec

from pulse_cli import config as config_file
from pulse_cli.gate import GATE_MODULES, tool_problems
from pulse_cli.home import EXIT_ERROR, Home
from pulse_cli.output import print_json, print_table, printable, without_passwords
from pulse_cli.stores import PROBE_NAMESPACE, served_log, served_side_store, shown
from pulse_core import SURVIVAL_GROUP, StoreError
from pulse_core.store import open_event_store, open_side_store


class Check(msgspec.Struct, frozen=True):
    """One thing doctor looked at: its name, whether it is there, and what was found (or,
    when it is not, what is wrong and what to do)."""

    name: str
    ok: bool
    detail: str


def _survival() -> Check:
    found = {ep.value for ep in importlib.metadata.entry_points(group=SURVIVAL_GROUP)}
    if len(found) == 1:
        return Check("survival", True, found.pop())
    have = ", ".join(sorted(found)) or "none"
    return Check("survival", False, f"exactly one survival layer must be installed in "
                 f"entry-point group {SURVIVAL_GROUP!r}, found {have} — reinstall upulse")


def _writable(root: Path) -> Check:
    """Whether `root` is a folder this process can write, or one it can create."""
    folder = root.expanduser().absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    new = "" if folder == root.expanduser().absolute() else f" (it will be made in {folder})"
    if not folder.is_dir():
        return Check("home", False, f"{root} cannot be made: {folder} is not a folder — "
                     "choose another home with --home or $UPULSE_HOME")
    if not os.access(folder, os.W_OK | os.X_OK):
        return Check("home", False, f"{root} is not writable: this user cannot write in "
                     f"{folder} — change its permissions, or choose another home with "
                     "--home or $UPULSE_HOME")
    return Check("home", True, f"{root} is writable{new}")


async def _log(url: str) -> Check:
    """Whether the event log at `url` (on a server) answers a read."""
    try:
        events = await open_event_store(url, read_only=True)
        try:
            count = await events.last_seq()
        finally:
            await events.close()
    except (StoreError, ImportError) as exc:
        return Check("store", False, without_passwords(" ".join(str(exc).split())))
    return Check("store", True, f"{shown(url)} answers; its log holds {count} events")


async def _side(url: str) -> Check:
    """Whether the side store at `url` (on a server) answers a read."""
    try:
        side = await open_side_store(url, read_only=True)
        try:
            await side.get_all(PROBE_NAMESPACE)
        finally:
            await side.close()
    except (StoreError, ImportError) as exc:
        return Check("side store", False, without_passwords(" ".join(str(exc).split())))
    return Check("side store", True, f"{shown(url)} answers")


def _servers(home: Home) -> list[Check]:
    """The checks of the servers config.json names (none for a home kept in its files)."""
    if not home.config.is_file():
        return []
    try:
        cfg = config_file.load(home.config)
    except config_file.ConfigError as exc:
        return [Check("config", False, str(exc))]

    log, side = served_log(cfg), served_side_store(cfg)

    async def reach() -> list[Check]:
        return ([await _log(log)] if log else []) + ([await _side(side)] if side else [])

    return asyncio.run(reach())


def checks(home: Home) -> list[Check]:
    """Every check doctor makes, in the order it shows them."""
    problems = tool_problems()
    tools = [Check(name, name not in problems, problems.get(name, "installed"))
             for name in ("git", *GATE_MODULES)]
    return [Check("python", True, f"{sys.executable} {sys.version.split()[0]}"), *tools,
            _survival(), _writable(home.root), *_servers(home)]


def doctor(home: Home, *, as_json: bool) -> int:
    """Show every check; exit 0 when promote and the daemon have all they need, else 1 after
    one message listing everything missing and what to do about each."""
    found = checks(home)
    missing = [c for c in found if not c.ok]
    if as_json:
        print_json({"ok": not missing, "checks": [msgspec.to_builtins(c) for c in found]})
    else:
        print_table(("CHECK", "STATUS", "DETAIL"),
                    [[c.name, "ok" if c.ok else "MISSING", printable(c.detail)]
                     for c in found], "")
    if not missing:
        return 0
    print(f"upulse doctor: {len(missing)} problem(s): "
          + "; ".join(f"{c.name}: {c.detail}" for c in missing), file=sys.stderr)
    return EXIT_ERROR
