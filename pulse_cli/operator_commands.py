"""The operator's commands: `effects cancel|retry`, `memory list|show|exchange|recall`, `metrics`
and `ui` (docs/operations.md)."""

from __future__ import annotations

import argparse
from typing import Any

from pulse_cli.parsing import command, json_flag


def _effect_control(sub: Any) -> None:
    for action, help in (
        ("cancel", "cancel a pending (or retrying) effect: the executor loop never runs it"),
        ("retry", "run a finally failed (or cancelled) effect again: its max attempts and backoff "
                  "start over"),
    ):
        parser = command(sub, action, f"effect_control.{action}", help,
                         lambda a, h: {"effect_id": a.id, "reason": a.reason,
                                       "as_json": a.json})
        parser.add_argument("id", metavar="ID", help="the effect's id (`upulse effects`)")
        parser.add_argument("--reason", default=f"{action} from the command line",
                            help="why, recorded in the event")
        json_flag(parser, "print the stored event")


def _memory(sub: Any) -> None:
    parser = sub.add_parser("memory", help="read and feed the agent's memory (identities)",
                            description="list identities, show one's records, or record an "
                                        "exchange the awareness reviewer will review")
    actions = parser.add_subparsers(dest="action", required=True)
    listing = command(actions, "list", "memory.list_identities",
                      "every identity with its record counts and last exchange",
                      lambda a, h: {"as_json": a.json})
    json_flag(listing)
    show = command(actions, "show", "memory.show", "one identity's records",
                   lambda a, h: {"identity": a.identity, "as_json": a.json})
    show.add_argument("identity", metavar="IDENTITY",
                      help="the identity's id (`upulse memory list` lists them)")
    json_flag(show)
    exchange = command(actions, "exchange", "memory.exchange",
                       "record an exchange with IDENTITY (registered if new)",
                       lambda a, h: {"identity": a.identity, "text": a.text, "role": a.role,
                                     "as_json": a.json})
    exchange.add_argument("identity", metavar="IDENTITY",
                          help="the identity's id (a new one is registered)")
    exchange.add_argument("text", metavar="TEXT", help="what was said")
    exchange.add_argument("--role", choices=("human", "agent"), default="human",
                          help="who said it (default: human)")
    json_flag(exchange, "print the stored event")
    found = command(actions, "recall", "memory.recall",
                    "what the agent recalls by identity, topic or text, best first",
                    lambda a, h: {"identity": a.identity, "topic": a.topic, "text": a.text,
                                  "limit": a.limit, "archived": a.archived,
                                  "as_json": a.json})
    found.add_argument("text", metavar="TEXT", nargs="?", default=None,
                       help="words that must all occur in the element's text")
    found.add_argument("--identity", default=None, help="only this identity's elements")
    found.add_argument("--topic", default=None,
                       help="a state item's name, or an observation's key or source")
    found.add_argument("--limit", type=int, default=10, help="at most N (default 10)")
    found.add_argument("--archived", action="store_true",
                       help="archived elements too (ordinary recall leaves them out)")
    json_flag(found)


def add_operator_commands(sub: Any, effects: argparse.ArgumentParser) -> None:
    """Add the operator's commands to `upulse`'s subparsers `sub`; cancel and retry go
    under the `effects` command."""
    _effect_control(effects.add_subparsers(dest="action", metavar="{cancel,retry}"))
    _memory(sub)
    command(sub, "metrics", "metrics.metrics",
                      "print the engine's metrics in Prometheus' text format (from the running "
                      "daemon's web service when it serves, else from the log)")
    ui = command(sub, "ui", "ui.ui",
                 "print the web UI's address and token (the daemon serves it when "
                 "config.json's layers name \"web\")", lambda a, h: {"as_json": a.json})
    json_flag(ui)
