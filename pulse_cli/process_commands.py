"""How `upulse process` is declared (docs/cli.md): the essential processes the survival layer
supervises, listed, started, stopped, restarted, reset out of FATAL, and their output logs."""

from __future__ import annotations

import argparse
import math
from typing import Any

from pulse_cli.parsing import command, json_flag
from pulse_cli.queries import parse_count

WAIT_S = 30.0
"""How long a control waits, by default, for the daemon to act on it."""
_CONTROLS = (
    ("start", "start a stopped (or FATAL) process; one already running is refused"),
    ("stop", "stop a process (SIGTERM, then SIGKILL after 10 s) and keep it stopped until "
             "started again"),
    ("restart", "stop a process and start it again"),
    ("reset", "clear a FATAL process: supervised again, its backoff and budget afresh"),
)


def _wait(text: str) -> float:
    """A number of seconds, 0 or more (an argparse type)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds, 0 or more")
    return seconds


def add_process_commands(sub: Any) -> None:
    """Add `process` to `upulse`'s subparsers `sub`."""
    parser = sub.add_parser(
        "process", help="the essential processes the survival layer supervises: list, start, "
                        "stop, restart, reset, log",
        description="list the essential processes as supervisorctl does (from the log, no "
                    "daemon needed), read their output logs, or ask the running daemon to "
                    "start, stop, restart or reset one (refused when no daemon runs)")
    actions = parser.add_subparsers(dest="action", required=True)
    listing = command(actions, "list", "processes.list_processes",
                      "each process: state, pid, uptime, restarts in the last hour, note",
                      lambda a, h: {"as_json": a.json})
    json_flag(listing)
    for action, help in _CONTROLS:
        control = command(actions, action, "processes.control", help,
                          lambda a, h: {"name": a.name, "action": a.action,
                                        "reason": a.reason or f"{a.action} from the command "
                                                              "line",
                                        "wait_s": a.wait, "as_json": a.json})
        control.add_argument("name", metavar="NAME", help="the process (`upulse process list`)")
        control.add_argument("--reason", help="why, recorded in the request")
        control.add_argument("--wait", type=_wait, default=WAIT_S, metavar="S",
                             help=f"seconds to wait for the daemon to act (default "
                                  f"{WAIT_S:g}; 0: only ask)")
        json_flag(control, "the stored request and what the daemon did, as one JSON document")
    log = command(actions, "log", "processes.log",
                  "the end of a process's output log (its survival `log`, else "
                  "HOME/logs/NAME.log)",
                  lambda a, h: {"name": a.name, "lines": a.n, "follow_on": a.follow,
                                "as_json": a.json})
    log.add_argument("name", metavar="NAME", help="the process (`upulse process list`)")
    log.add_argument("-n", type=parse_count, default=50, metavar="N",
                     help="how many lines (default 50)")
    log.add_argument("--follow", "-f", action="store_true", help="then print new lines")
    json_flag(log, "the lines as a JSON array of strings (a JSON string a line with --follow)")
