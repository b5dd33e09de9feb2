"""A pulse home that serves MCP, for the tests that run real agent hosts against `upulse mcp`."""

from __future__ import annotations

import json
from pathlib import Path

import psutil

from pulse_core import Event
from tests.adapters.hermes.rig import UPULSE, read_events, upulse

__all__ = ["UPULSE", "facts", "mcp_home", "server_args", "servers_of"]


def mcp_home(home: Path) -> Path:
    """`home` laid out by `upulse init`, serving MCP as the agent `ada`, its memory knowing
    `ana` (the tools never create an identity)."""
    upulse(home, "init")
    config = json.loads((home / "config.json").read_text())
    config["mcp"] = {"agent": "ada"}
    (home / "config.json").write_text(json.dumps(config))
    upulse(home, "memory", "exchange", "ana", "hello there")
    return home


def server_args(home: Path) -> list[str]:
    """The arguments a host starts `upulse` with to serve `home`."""
    return ["mcp", "--home", str(home)]


async def facts(home: Path) -> list[Event]:
    """The facts recorded in `home`'s log, their text opened."""
    return await read_events(home, kinds=["temporal-fact-recorded"])


def servers_of(home: Path) -> list[psutil.Process]:
    """The `upulse mcp` processes serving `home` still alive (a zombie is not)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        argv = process.info["cmdline"] or []
        if (process.info["status"] != psutil.STATUS_ZOMBIE and "mcp" in argv
                and str(home) in argv and any(a.endswith("upulse") for a in argv)):
            found.append(process)
    return found
