"""`upulse`: run, inspect and evolve a pulse engine from the shell (docs/cli.md)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pulse_cli.home import (
    EXIT_ERROR,
    EXIT_USAGE,
    CliError,
    Home,
    is_instance_name,
    resolve_home,
)
from pulse_cli.output import printable
from pulse_cli.queries import parse_duration, parse_since
from pulse_core import PulseError
from pulse_core._homelock import denied, loose_home

DESCRIPTION = """\
Run, inspect and evolve a pulse engine. Every command acts on one home: --home DIR, or
--instance NAME ($UPULSE_HOME/instances/NAME), else $UPULSE_HOME, else ~/.upulse.
"""
EXIT_CODES = """\
exit codes:
  0  ok
  1  error: the message says what failed and what to do
  2  usage: an unknown command, option or malformed argument
  3  the daemon is already running (daemon start) or is not running (stop, status)
  4  the promote gate refused the staged code (promote, deploy)
"""

Arguments = Callable[[argparse.Namespace, Home], dict[str, Any]]
INTERRUPT_IS_EXIT = frozenset({"events", "logs", "dev", "start", "run"})


def _home_options(parser: argparse.ArgumentParser, default: Any) -> None:
    group = parser.add_argument_group("home")
    group.add_argument("--home", type=Path, default=default,
                       help="the home folder (default: $UPULSE_HOME, else ~/.upulse)")
    group.add_argument("--instance", metavar="NAME", default=default,
                       help="the named instance $UPULSE_HOME/instances/NAME")


def _none(args: argparse.Namespace, home: Home) -> dict[str, Any]:
    return {}


def _command(sub: Any, name: str, target: str, help: str, arguments: Arguments = _none
             ) -> argparse.ArgumentParser:
    """A subcommand that calls `pulse_cli.<target>(home, **arguments(args, home))`; the
    module is imported only when the command runs, so every command starts fast."""
    listed = {"help": help} if help else {}  # without help, a command is not listed
    parser: argparse.ArgumentParser = sub.add_parser(name, description=help, **listed)
    _home_options(parser, argparse.SUPPRESS)  # after the command too; never overrides
    parser.set_defaults(target=target, arguments=arguments)
    return parser


def _daemon_commands(sub: Any) -> None:
    parser = sub.add_parser("daemon", help="run the engine as a background process",
                            description="run the engine of a home as a background process")
    actions = parser.add_subparsers(dest="action", required=True,
                                    metavar="{start,stop,status,logs,restart}")
    start = _command(actions, "start", "control.start",
                     "start the daemon and wait until it is ready (exit 3 if it already runs)",
                     lambda a, h: {"foreground": a.foreground})
    start.add_argument("--foreground", action="store_true",
                       help="run in this process, logging to stdout (for service managers)")
    stop = _command(actions, "stop", "control.stop",
                    "SIGTERM the daemon and wait while it drains its effects",
                    lambda a, h: {"timeout": a.timeout})
    stop.add_argument("--timeout", type=float, default=None,
                      help="seconds to wait (default: daemon.drain_timeout_s + 10)")
    status = _command(actions, "status", "instances.status",
                      "pid, uptime, revision, tick rate, pending effects, last errors",
                      lambda a, h: {"as_json": a.json})
    status.add_argument("--json", action="store_true", help="one JSON document")
    logs = _command(actions, "logs", "control.logs", "print the end of daemon.log",
                    lambda a, h: {"lines": a.n, "follow": a.follow})
    logs.add_argument("-n", type=int, default=50, help="how many lines (default 50)")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    _command(actions, "restart", "control.restart", "stop (if running), then start")
    _command(actions, "run", "daemon.run", "")  # what `start` spawns; not listed


def _query_commands(sub: Any) -> None:
    events = _command(sub, "events", "queries.events",
                      "list events of the log (the last --limit, or those after --since)",
                      lambda a, h: {"kinds": a.kind, "key": a.key, "since": a.since,
                                    "follow": a.follow, "as_json": a.json, "limit": a.limit})
    events.add_argument("--kind", action="append", metavar="K",
                        help="only this kind (repeat for several)")
    events.add_argument("--key", metavar="K", help="only events of this key")
    events.add_argument("--since", type=parse_since, metavar="SEQ|DURATION",
                        help="events after this seq (120) or this long ago (90s, 10m, 2h, 1d)")
    events.add_argument("--follow", "-f", action="store_true", help="then print new events")
    events.add_argument("--json", action="store_true",
                        help="a JSON array (JSON lines with --follow)")
    events.add_argument("--limit", type=int, default=100, help="at most N events (0: all)")
    effects = _command(sub, "effects", "queries.effects",
                       "list effects with their status (pending, executing, retrying, acked, "
                       "failed)",
                       lambda a, h: {"pending": a.pending, "failed": a.failed,
                                     "as_json": a.json, "limit": a.limit})
    which = effects.add_mutually_exclusive_group()
    which.add_argument("--pending", action="store_true", help="only unfinished effects")
    which.add_argument("--failed", action="store_true", help="only finally failed effects")
    effects.add_argument("--json", action="store_true", help="one JSON document")
    effects.add_argument("--limit", type=int, default=100, help="the newest N (0: all)")
    tasks = _command(sub, "tasks", "queries.tasks", "list tasks with their status",
                     lambda a, h: {"as_json": a.json, "status": a.status})
    tasks.add_argument("--status", help="only tasks in this status (pending, assigned, "
                       "executing, acked, closed, given-up)")
    tasks.add_argument("--json", action="store_true", help="one JSON document")
    vitals = _command(sub, "vitals", "queries.vitals",
                      "the latest reading of every vitals key, or recent samples of KEY",
                      lambda a, h: {"key": a.key, "since_s": a.since, "as_json": a.json,
                                    "limit": a.limit})
    vitals.add_argument("key", nargs="?", metavar="KEY")
    vitals.add_argument("--since", type=parse_duration, default=3600.0, metavar="DURATION",
                        help="with KEY: how far back (default 1h)")
    vitals.add_argument("--limit", type=int, default=20, help="with KEY: the newest N")
    vitals.add_argument("--json", action="store_true", help="one JSON document")
    tick = _command(sub, "tick", "dryrun.dry_tick",
                    "one tick against the live snapshot on a scratch copy; writes nothing",
                    lambda a, h: {"verbose": a.verbose, "as_json": a.json,
                                  "code_dir": h.staging if a.staging else None})
    tick.add_argument("--verbose", "-v", action="store_true", help="each rule's decision")
    tick.add_argument("--staging", action="store_true", help="run the staging code")
    tick.add_argument("--json", action="store_true", help="one JSON document")


_TASK_FIELDS = ("title", "project", "prompt", "priority", "agent", "result", "reason")


def _task_arguments(args: argparse.Namespace, home: Home) -> dict[str, Any]:
    fields = {name: getattr(args, name) for name in _TASK_FIELDS if hasattr(args, name)}
    return {"action": args.action, "task_id": args.id, "as_json": args.json, **fields}


def _task_commands(sub: Any) -> None:
    parser = sub.add_parser("task", help="move a task through its lifecycle",
                            description="append task lifecycle events (checked against the "
                                        "task's status and version)")
    actions = parser.add_subparsers(dest="action", required=True)

    def task(action: str, help: str) -> argparse.ArgumentParser:
        command = _command(actions, action, "queries.task_command", help, _task_arguments)
        command.add_argument("id", metavar="ID")
        command.add_argument("--json", action="store_true", help="print the stored event")
        return command

    create = task("create", "create a pending task")
    create.add_argument("--title", required=True)
    create.add_argument("--project", default="default")
    create.add_argument("--prompt", default="")
    create.add_argument("--priority", type=int, default=0, help="higher is sooner")
    task("assign", "give a pending task to an agent").add_argument("agent", metavar="AGENT")
    task("start", "the assigned agent started it")
    task("ack", "the agent reports a result").add_argument(
        "--result", metavar="JSON", help="the result, as JSON")
    task("close", "mark an acked task done")
    task("give-up", "abandon an unfinished task").add_argument("--reason", required=True)


def _release_commands(sub: Any) -> None:
    promote = _command(sub, "promote", "release.promote",
                       "gate the staging code (compile, mypy, tests, dry-run tick), merge it "
                       "into main and make the daemon reload; exit 4 if refused",
                       lambda a, h: {"as_json": a.json})
    promote.add_argument("--json", action="store_true", help="one JSON document")
    rollback = _command(sub, "rollback", "release.rollback",
                        "revert main to REV (default: the revision before the last promote) "
                        "with a new commit, and make the daemon reload",
                        lambda a, h: {"revision": a.revision, "reason": a.reason})
    rollback.add_argument("revision", nargs="?", metavar="REV")
    rollback.add_argument("--reason", default="rolled back from the command line")
    deploy = _command(sub, "deploy", "release.deploy",
                      "promote, then confirm the daemon runs the new revision (starting it "
                      "if stopped)", lambda a, h: {"wait_s": a.timeout})
    deploy.add_argument("--timeout", type=float, default=30.0, help="seconds to wait")
    dev = _command(sub, "dev", "release.dev",
                   "run the staging code on a scratch copy of the home with hot reload",
                   lambda a, h: {"seconds": a.seconds})
    dev.add_argument("--seconds", type=float, default=None, help="stop after this long")


def _instance_name(args: argparse.Namespace, home: Home) -> str:
    """The name `init` records: --instance, else the --home folder's name, else "default"."""
    if args.instance:
        return str(args.instance)
    if args.home and is_instance_name(home.root.name):
        return home.root.name
    return "default"


def build_parser() -> argparse.ArgumentParser:
    """The `upulse` argument parser."""
    parser = argparse.ArgumentParser(
        prog="upulse", description=DESCRIPTION, epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _home_options(parser, None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    init = _command(sub, "init", "instances.initialise",
                    "lay out a home: config.json, its stores (events, vitals, side, objects), "
                    "engine/, staging/; on an existing home, change nothing and say so",
                    lambda a, h: {"instance": _instance_name(a, h)})
    init.epilog = "Re-running init on an existing home changes nothing and says so."
    listing = _command(sub, "instances", "instances.instances",
                       "list the base home and every named instance with its status",
                       lambda a, h: {"as_json": a.json})
    listing.add_argument("--json", action="store_true", help="one JSON document")
    _daemon_commands(sub)
    _query_commands(sub)
    _task_commands(sub)
    _release_commands(sub)
    return parser


def _say_error(command: str, error: Exception) -> None:
    """An error on stderr as `upulse COMMAND: [Type: ]what was wrong — what to do`."""
    kind = "" if isinstance(error, CliError) else f"{type(error).__name__}: "
    print(f"upulse {command}: {kind}{printable(str(error), newlines=True)}", file=sys.stderr)


def _warn_if_open_to_others(home: Home, args: argparse.Namespace) -> None:
    """Warn on stderr when others may enter the home; a daemon's engine logs it itself."""
    engine_here = args.target == "daemon.run" or getattr(args, "foreground", False)
    warning = None if engine_here else loose_home(home.root)
    if warning is not None:
        print(f"upulse: warning: {printable(warning)}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `upulse` command; returns its exit code (see EXIT_CODES)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    name = getattr(args, "action", None) or args.command
    try:
        home = Home(resolve_home(args.home, args.instance))
        _warn_if_open_to_others(home, args)
        module, _, function = str(args.target).partition(".")
        run = getattr(importlib.import_module(f"pulse_cli.{module}"), function)
        outcome = run(home, **args.arguments(args, home))
        if not isinstance(outcome, int):
            outcome = asyncio.run(outcome)
        return int(outcome)
    except CliError as exc:
        _say_error(args.command, exc)
        return exc.exit_code
    except PulseError as exc:
        _say_error(args.command, exc)
        return EXIT_ERROR
    except PermissionError as exc:  # one that no typed error names yet (git, say)
        _say_error(args.command, denied(Path(exc.filename or "?"), "read or write"))
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 0 if name in INTERRUPT_IS_EXIT else 130
