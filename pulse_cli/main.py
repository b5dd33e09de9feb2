"""`upulse`: run, inspect and evolve a pulse engine from the shell (docs/cli.md)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pulse_cli.backtest import BACKTEST_TICKS
from pulse_cli.backup_commands import add_backup_commands
from pulse_cli.home import (
    EXIT_ERROR,
    EXIT_USAGE,
    CliError,
    Home,
    UsageError,
    is_instance_name,
    resolve_home,
)
from pulse_cli.maintenance_commands import add_maintenance_commands
from pulse_cli.operator_commands import add_operator_commands
from pulse_cli.output import did_you_mean, nearest, printable, without_passwords
from pulse_cli.parsing import command as _command
from pulse_cli.parsing import home_options, json_flag
from pulse_cli.process_commands import add_process_commands
from pulse_cli.queries import (
    TASK_STATUSES,
    parse_count,
    parse_duration,
    parse_page,
    parse_port,
    parse_seconds,
    parse_since,
)
from pulse_core import PulseError, denied, loose_home

DESCRIPTION = """\
Run, inspect and evolve a pulse engine. Every command acts on one home: --home DIR, or
--instance NAME ($UPULSE_HOME/instances/NAME), else $UPULSE_HOME, else ~/.upulse.
"""
EXIT_CODES = """\
exit codes:
  0  ok
  1  error: the message says what failed and what to do
  2  usage: an unknown command, option or malformed argument
  3  the daemon is already running (daemon start, migrate) or is not running (stop, status);
     a replayed tick decides other effects than it recorded (replay)
  4  the promote gate refused the staged code (promote, deploy; a backtest past --max-diff
     too)
"""

INTERRUPT_IS_EXIT = frozenset({"events", "logs", "log", "dev", "start", "run"})
DISTRIBUTION = "upulse"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose unknown choices (a command, a status, a shell) name the
    nearest known one."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            known = [str(choice) for choice in action.choices]
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r}{did_you_mean(str(value), known)} "
                        f"(choose from {', '.join(known)})")


class _Version(argparse.Action):
    """`--version`: the installed distribution's version, looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                         nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        try:
            version = importlib.metadata.version(DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            version = f"unknown ({DISTRIBUTION} is not installed; run from a source tree)"
        print(f"upulse {version}")
        parser.exit()


def _daemon_commands(sub: Any) -> None:
    parser = sub.add_parser("daemon", help="run the engine as a background process",
                            description="run the engine of a home as a background process")
    actions = parser.add_subparsers(dest="action", required=True,
                                    metavar="{start,stop,status,logs,restart}")
    start = _command(actions, "start", "control.start",
                     "start the daemon and wait until it is ready (exit 3 if it already runs)",
                     lambda a, h: {"foreground": a.foreground, "as_json": a.json})
    start.add_argument("--foreground", action="store_true",
                       help="run in this process, logging to stdout (for service managers)")
    json_flag(start, "the pid and home of the started daemon as one JSON document")
    stop = _command(actions, "stop", "control.stop",
                    "SIGTERM the daemon and wait while it drains its effects",
                    lambda a, h: {"timeout": a.timeout, "as_json": a.json})
    stop.add_argument("--timeout", type=parse_seconds, default=None, metavar="S",
                      help="seconds to wait (default: daemon.drain_timeout_s + 10)")
    json_flag(stop, "the pid of the stopped daemon as one JSON document")
    status = _command(actions, "status", "instances.status",
                      "pid, uptime, revision, tick rate, pending effects, last errors",
                      lambda a, h: {"as_json": a.json})
    json_flag(status)
    logs = _command(actions, "logs", "control.logs", "print the end of daemon.log",
                    lambda a, h: {"lines": a.n, "follow": a.follow, "as_json": a.json})
    logs.add_argument("-n", type=parse_count, default=50, metavar="N",
                      help="how many lines (default 50)")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    json_flag(logs, "the lines as a JSON array of strings (a JSON string a line with --follow)")
    restart = _command(actions, "restart", "control.restart", "stop (if running), then start",
                       lambda a, h: {"as_json": a.json})
    json_flag(restart, "the stopped and the started daemon's pids as one JSON document")
    _command(actions, "run", "daemon.run", "")  # what `start` spawns; not listed


def _query_commands(sub: Any) -> argparse.ArgumentParser:
    events = _command(sub, "events", "queries.events",
                      "list events of the log (the last --limit, or those after --since)",
                      lambda a, h: {"kinds": a.kind, "key": a.key, "since": a.since,
                                    "follow": a.follow, "as_json": a.json, "limit": a.limit,
                                    "causes": a.causes})
    events.add_argument("--kind", action="append", metavar="K",
                        help="only this kind (repeat for several)")
    events.add_argument("--key", metavar="K", help="only events of this key")
    events.add_argument("--since", type=parse_since, metavar="SEQ|DURATION",
                        help="events after this seq (120) or this long ago (90s, 10m, 2h, 1d)")
    events.add_argument("--follow", "-f", action="store_true", help="then print new events")
    events.add_argument("--json", action="store_true",
                        help="a JSON array (JSON lines with --follow)")
    events.add_argument("--limit", type=parse_count, default=100, metavar="N",
                        help="at most N events (0: all)")
    events.add_argument("--causes", action="store_true",
                        help="under each event, the tick that decided it and the events its "
                             "cause leads back to (with --json: its tick and causes fields); "
                             "with --key, the history of that key")
    fleet = _command(sub, "fleet", "drill.fleet",
                     "the engines that write this log: live, stale or stopped, their loops, "
                     "last tick and the leases they hold", lambda a, h: {"as_json": a.json})
    json_flag(fleet)
    effects = _command(sub, "effects", "queries.effects",
                       "list effects with their status (pending, executing, retrying, acked, "
                       "failed, cancelled); cancel or retry one",
                       lambda a, h: {"pending": a.pending, "failed": a.failed,
                                     "as_json": a.json, "limit": a.limit})
    which = effects.add_mutually_exclusive_group()
    which.add_argument("--pending", action="store_true", help="only unfinished effects")
    which.add_argument("--failed", action="store_true", help="only finally failed effects")
    json_flag(effects)
    effects.add_argument("--limit", type=parse_count, default=100, metavar="N",
                         help="the newest N (0: all)")
    tasks = _command(sub, "tasks", "queries.tasks", "list tasks with their status",
                     lambda a, h: {"as_json": a.json, "status": a.status})
    tasks.add_argument("--status", choices=TASK_STATUSES, metavar="S",
                       help=f"only tasks in this status ({', '.join(TASK_STATUSES)})")
    json_flag(tasks)
    vitals = _command(sub, "vitals", "queries.vitals",
                      "the latest reading of every vitals key, or recent samples of KEY",
                      lambda a, h: {"key": a.key, "since_s": a.since, "as_json": a.json,
                                    "limit": a.limit})
    vitals.add_argument("key", nargs="?", metavar="KEY",
                        help="a vitals key (`upulse vitals` lists them)")
    vitals.add_argument("--since", type=parse_duration, default=3600.0, metavar="DURATION",
                        help="with KEY: how far back (default 1h)")
    vitals.add_argument("--limit", type=parse_count, default=20, metavar="N",
                        help="with KEY: the newest N (default 20; 0: all)")
    json_flag(vitals)
    tick = _command(sub, "tick", "dryrun.dry_tick",
                    "one tick against the live snapshot on a scratch copy; writes nothing",
                    lambda a, h: {"verbose": a.verbose, "as_json": a.json,
                                  "code_dir": h.staging if a.staging else None})
    tick.add_argument("--verbose", "-v", action="store_true", help="each rule's decision")
    tick.add_argument("--staging", action="store_true", help="run the staging code")
    json_flag(tick)
    replay = _command(sub, "replay", "replay.replay",
                      "run a recorded tick again on the snapshot it saw and diff its effects "
                      "with the recorded ones; writes nothing; exit 3 if they differ",
                      lambda a, h: {"tick": a.tick, "revision": a.revision,
                                    "staged": a.staged, "verbose": a.verbose,
                                    "as_json": a.json})
    replay.add_argument("tick", type=parse_count, metavar="TICK",
                        help="the tick's number (`upulse events --kind tick` lists them)")
    which = replay.add_mutually_exclusive_group()
    which.add_argument("--revision", metavar="REV",
                       help="run this revision of the engine directory (default: the one "
                            "that ran the tick)")
    which.add_argument("--staged", action="store_true", help="run the staging code")
    replay.add_argument("--verbose", "-v", action="store_true",
                        help="each rule's decision then and now, side by side")
    json_flag(replay)
    return effects


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
        command.add_argument("id", metavar="ID", help="the task's id (its events' key)")
        json_flag(command, "print the stored event")
        return command

    create = task("create", "create a pending task")
    create.add_argument("--title", required=True, help="what the task is, in a line")
    create.add_argument("--project", default="default",
                        help="the project it belongs to (default: default)")
    create.add_argument("--prompt", default="", help="the instructions the agent gets")
    create.add_argument("--priority", type=int, default=0, help="higher is sooner (default 0)")
    task("assign", "give a pending task to an agent").add_argument(
        "agent", metavar="AGENT", help="the agent that will run it")
    task("start", "the assigned agent started it")
    task("ack", "the agent reports a result").add_argument(
        "--result", metavar="JSON", help="the result, as JSON")
    task("close", "mark an acked task done")
    task("give-up", "abandon an unfinished task").add_argument(
        "--reason", required=True, help="why it was abandoned")


def _backtest_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backtest", type=parse_count, default=BACKTEST_TICKS, metavar="N",
                        help="replay the staged code over the last N recorded ticks and show "
                             f"how its effects differ (default {BACKTEST_TICKS}; 0: none)")
    parser.add_argument("--max-diff", type=parse_count, default=None, metavar="N",
                        help="refuse the promote when more than N effects differ in the "
                             "backtest (default: show the diff, refuse nothing)")


def _backtest_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"backtest_ticks": args.backtest, "max_diff": args.max_diff}


def _release_commands(sub: Any) -> None:
    promote = _command(sub, "promote", "release.promote",
                       "gate the staging code (compile, mypy, tests, dry-run tick, backtest "
                       "over recorded ticks), merge it into main and make the daemon reload; "
                       "exit 4 if refused",
                       lambda a, h: {"as_json": a.json, **_backtest_options(a)})
    _backtest_flags(promote)
    json_flag(promote)
    rollback = _command(sub, "rollback", "release.rollback",
                        "revert main to REV (default: the revision before the last promote) "
                        "with a new commit, and make the daemon reload",
                        lambda a, h: {"revision": a.revision, "reason": a.reason,
                                      "as_json": a.json})
    rollback.add_argument("revision", nargs="?", metavar="REV",
                          help="a commit of main, as git names it (default: before the last "
                               "promote)")
    rollback.add_argument("--reason", default="rolled back from the command line",
                          help="why, recorded in the rollback event")
    json_flag(rollback)
    deploy = _command(sub, "deploy", "release.deploy",
                      "promote, then confirm the daemon runs the new revision (starting it "
                      "if stopped)", lambda a, h: {"wait_s": a.timeout, "as_json": a.json,
                                                   **_backtest_options(a)})
    deploy.add_argument("--timeout", type=parse_seconds, default=30.0, metavar="S",
                        help="seconds to wait for the daemon (default 30)")
    _backtest_flags(deploy)
    json_flag(deploy)
    dev = _command(sub, "dev", "release.dev",
                   "run the staging code on a scratch copy of the home with hot reload",
                   lambda a, h: {"seconds": a.seconds, "as_json": a.json})
    dev.add_argument("--seconds", type=parse_seconds, default=None, metavar="S",
                     help="stop after this long (default: at Ctrl-C)")
    json_flag(dev, "each event the scratch engine writes as a line of JSON")


def _instance_name(args: argparse.Namespace, home: Home) -> str:
    """The name `init` records: --instance, else the --home folder's name, else "default"."""
    if args.instance:
        return str(args.instance)
    if args.home and is_instance_name(home.root.name):
        return home.root.name
    return "default"


def build_parser() -> argparse.ArgumentParser:
    """The `upulse` argument parser."""
    parser = Parser(
        prog="upulse", description=DESCRIPTION, epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version,
                        help=f"print the installed {DISTRIBUTION} version and exit")
    home_options(parser, None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    init = _command(sub, "init", "initialise.initialise",
                    "lay out a home: config.json, its stores (events, vitals, side, objects), "
                    "engine/, staging/; what exists (an embedded engine's log) is kept",
                    lambda a, h: {"instance": _instance_name(a, h), "store": a.store,
                                  "side_store": a.side_store, "host": a.host,
                                  "as_json": a.json})
    init.epilog = "Re-running init on an existing home changes nothing and says so."
    init.add_argument("--store", metavar="URL",
                      help="keep the event log there: postgresql://user@host:5432/db (checked "
                           "now: reachable, schema created; default: HOME/events.db)")
    init.add_argument("--side-store", metavar="URL",
                      help="keep the side store there: redis://host:6379/0 (checked now; "
                           "default: HOME/state.db)")
    init.add_argument("--host", metavar="NAME",
                      help="the name this home's engine gives its host in a log it shares "
                           "(claims, promote and rollback events); one per home (default: "
                           "this machine's hostname and a random suffix)")
    json_flag(init, "print the home, the instance and what was created as one JSON document")
    migrate = _command(sub, "migrate", "migrate.migrate",
                       "copy this home's event log into an empty log of any store backend "
                       "(PostgreSQL, SQLite, ...) exactly, verify every row, and with --switch "
                       "point config.json at it",
                       lambda a, h: {"to": a.to, "switch": a.switch, "page": a.page,
                                     "as_json": a.json})
    migrate.add_argument("--to", required=True, metavar="URL",
                         help="the empty target's store URL: postgresql://user@host:5432/db, "
                              "sqlite:///abs/path/events.db, or another installed backend's")
    migrate.add_argument("--switch", action="store_true",
                         help="once verified, set config.json's store to URL (the old log is "
                              "kept as it is)")
    migrate.add_argument("--page", type=parse_page, default=5_000, metavar="N",
                         help="events copied (and verified) per transaction (default 5000)")
    json_flag(migrate, "print the counts and the verdict as one JSON document (no progress)")
    listing = _command(sub, "instances", "instances.instances",
                       "list the base home and every named instance with its status",
                       lambda a, h: {"as_json": a.json})
    json_flag(listing)
    _daemon_commands(sub)
    add_operator_commands(sub, _query_commands(sub))
    add_maintenance_commands(sub)
    add_process_commands(sub)
    _task_commands(sub)
    _release_commands(sub)
    add_backup_commands(sub)
    mcp = _command(sub, "mcp", "mcp_server.serve",
                   "serve the agent's tools (remember, recall, tasks, watches, commitments, "
                   "notices) over MCP on stdio, or with --http on 127.0.0.1 behind the web "
                   "UI's token, as the agent config.json's `mcp` section names (docs/mcp.md)",
                   lambda a, h: {"http": a.http, "port": a.port})
    mcp.add_argument("--http", action="store_true",
                     help="serve streamable HTTP on http://127.0.0.1:PORT/mcp instead of "
                          "stdio; every request needs `Authorization: Bearer <token>` "
                          "(`upulse ui` prints the token)")
    mcp.add_argument("--port", type=parse_port, metavar="N",
                     help="the port --http listens on, on 127.0.0.1 only (default 8422; 0 "
                          "picks a free one, printed on stderr)")
    doctor = _command(sub, "doctor", "doctor.doctor",
                      "check that this machine has what promote and the daemon need",
                      lambda a, h: {"as_json": a.json})
    json_flag(doctor)
    completion = _command(sub, "completion", "completion.print_script",
                          "print a shell completion script (eval \"$(upulse completion "
                          "bash)\" in ~/.bashrc)", lambda a, h: {"shell": a.shell})
    completion.add_argument("shell", choices=("bash", "zsh"), help="the shell: bash or zsh")
    return parser


def _say_error(command: str, error: Exception) -> None:
    """An error on stderr as `upulse COMMAND: what was wrong — what to do`, with the
    password of any URL in it cut out."""
    print(f"{command}: {printable(without_passwords(str(error)), newlines=True)}",
          file=sys.stderr)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The parsed command line; SystemExit for --help, --version and usage errors, which
    print the usage of the command they are in."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        command: argparse.ArgumentParser = getattr(args, "parser", parser)
        close = nearest(extras[0].partition("=")[0], command._option_string_actions)
        hint = f" — did you mean {close}?" if close and extras[0].startswith("-") else ""
        command.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
    return args


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
        args = _parse(parser, argv)
    except SystemExit as exc:  # --help, --version (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    name = getattr(args, "action", None) or args.command
    command: argparse.ArgumentParser = args.parser
    try:
        home = Home(resolve_home(args.home, args.instance))
        _warn_if_open_to_others(home, args)
        module, _, function = str(args.target).partition(".")
        run = getattr(importlib.import_module(f"pulse_cli.{module}"), function)
        outcome = run(home, **args.arguments(args, home))
        if not isinstance(outcome, int):
            outcome = asyncio.run(outcome)
        return int(outcome)
    except UsageError as exc:
        command.print_usage(sys.stderr)
        _say_error(command.prog, exc)
        return exc.exit_code
    except CliError as exc:
        _say_error(command.prog, exc)
        return exc.exit_code
    except PulseError as exc:
        _say_error(command.prog, exc)
        return EXIT_ERROR
    except PermissionError as exc:  # one that no typed error names yet (git, say)
        _say_error(command.prog, denied(Path(exc.filename or "?"), "read or write"))
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 0 if name in INTERRUPT_IS_EXIT else 130
