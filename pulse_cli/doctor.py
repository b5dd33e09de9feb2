"""`upulse doctor`: whether this machine has everything promote and the daemon need.

It checks, and lists every problem in one message: git on PATH, mypy and pytest for this
interpreter (the promote gate runs them), exactly one survival layer installed (the daemon
refuses to run without it), and a home it can write (or create).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

import msgspec

from pulse_cli.gate import GATE_MODULES, tool_problems
from pulse_cli.home import EXIT_ERROR, Home
from pulse_cli.output import print_json, print_table, printable
from pulse_core._layer import SURVIVAL_GROUP


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
                 f"entry-point group {SURVIVAL_GROUP!r}, found {have} — reinstall pulse-engine")


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


def checks(home: Home) -> list[Check]:
    """Every check doctor makes, in the order it shows them."""
    problems = tool_problems()
    tools = [Check(name, name not in problems, problems.get(name, "installed"))
             for name in ("git", *GATE_MODULES)]
    return [Check("python", True, f"{sys.executable} {sys.version.split()[0]}"), *tools,
            _survival(), _writable(home.root)]


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
