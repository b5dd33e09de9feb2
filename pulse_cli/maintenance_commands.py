"""How `upulse maintenance` and `upulse runs` are declared (docs/cli.md): the maintenance
layer's cycles, and the agent runs of tasks."""

from __future__ import annotations

import argparse
from typing import Any

from pulse_cli.parsing import command, json_flag


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, 1 or more")
    return int(text)


def _maintenance(sub: Any) -> None:
    parser = sub.add_parser(
        "maintenance", help="the maintenance layer's cycles: report, history, health, run",
        description="read what memory maintenance did (from the log, no daemon needed), or "
                    "ask the running daemon for a cycle now")
    actions = parser.add_subparsers(dest="action", required=True)
    report = command(actions, "report", "maintenance.report",
                     "the newest ended cycle's report (or CYCLE's)",
                     lambda a, h: {"cycle": a.cycle, "as_json": a.json})
    report.add_argument("cycle", metavar="CYCLE", nargs="?",
                        help="a cycle's id (`upulse maintenance history`)")
    json_flag(report, "the report as stored in the cycle's activity-completed")
    history = command(actions, "history", "maintenance.history",
                      "the cycles, newest first: when, trigger, status, duration, changes",
                      lambda a, h: {"limit": a.limit, "as_json": a.json})
    history.add_argument("--limit", type=_positive, default=20,
                         help="how many cycles (default 20; the newest 50 are kept)")
    json_flag(history)
    health = command(actions, "health", "maintenance.health",
                     "the ten health signals of the newest report (exit 3: one does not hold)",
                     lambda a, h: {"as_json": a.json})
    json_flag(health)
    run = command(actions, "run", "maintenance.run",
                  "ask the running daemon's maintenance layer for a cycle now",
                  lambda a, h: {"reason": a.reason, "as_json": a.json})
    run.add_argument("--reason", default="asked for from the command line",
                     help="why, recorded in the request")
    json_flag(run, "print the stored request")


def _runs(sub: Any) -> None:
    runs = command(sub, "runs", "runs.runs",
                   "each agent task's runs: agent, state, start, duration, exit code, "
                   "requeues, tokens, transcript",
                   lambda a, h: {"task": a.task, "agent": a.agent,
                                 "transcript": a.transcript, "as_json": a.json})
    runs.add_argument("--task", metavar="ID", help="only this task's runs")
    runs.add_argument("--agent", metavar="NAME", help="only this agent's runs")
    runs.add_argument("--transcript", metavar="RUN",
                      help="print what run RUN (its id, or its transcript hash's start) "
                           "wrote to stdout, as stored")
    json_flag(runs)


def add_maintenance_commands(sub: Any) -> None:
    """Add `maintenance` and `runs` to `upulse`'s subparsers `sub`."""
    _maintenance(sub)
    _runs(sub)
