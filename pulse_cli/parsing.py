"""How `upulse` subcommands are declared: each names the function that runs it, imported only
when the command runs, so every command starts fast."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pulse_cli.home import Home

Arguments = Callable[[argparse.Namespace, Home], dict[str, Any]]
"""What a command's function is called with, besides the home, from the parsed line."""


def home_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """--home and --instance, on the top parser (default None) and on each command."""
    group = parser.add_argument_group("home")
    group.add_argument("--home", type=Path, default=default,
                       help="the home folder (default: $UPULSE_HOME, else ~/.upulse)")
    group.add_argument("--instance", metavar="NAME", default=default,
                       help="the named instance $UPULSE_HOME/instances/NAME")


def _none(args: argparse.Namespace, home: Home) -> dict[str, Any]:
    return {}


def command(sub: Any, name: str, target: str, help: str, arguments: Arguments = _none
            ) -> argparse.ArgumentParser:
    """A subcommand that calls `pulse_cli.<target>(home, **arguments(args, home))`."""
    listed = {"help": help} if help else {}  # without help, a command is not listed
    parser: argparse.ArgumentParser = sub.add_parser(name, description=help, **listed)
    home_options(parser, argparse.SUPPRESS)  # after the command too; never overrides
    parser.set_defaults(target=target, arguments=arguments, parser=parser)
    return parser


def json_flag(parser: argparse.ArgumentParser, help: str = "one JSON document") -> None:
    """--json: the command prints JSON instead of a table."""
    parser.add_argument("--json", action="store_true", help=help)
