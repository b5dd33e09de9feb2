"""A throwaway home with an `mcp` section, and `upulse mcp` as a real subprocess driven by the
MCP SDK's own client, over stdio or over streamable HTTP; and a home the real agent hosts
serve through `upulse mcp`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from pulse_core import Event, SqliteEventStore
from tests.adapters.hermes.rig import UPULSE, read_events, upulse
from tests.cli.runner import Upulse
from tests.timing import scaled

__all__ = ["UPULSE", "events", "facts", "http_server", "http_session", "make_home", "mcp_home",
           "server_args", "servers_of", "session_over", "stdio_session", "text", "token"]


def make_home(upulse: Upulse, tmp_path: Path, **mcp: Any) -> Path:
    """A home whose `mcp` section names agent ada (plus `mcp`), where ana is known."""
    home = upulse.init(tmp_path / "home")
    config = json.loads((home / "config.json").read_text())
    config["mcp"] = {"agent": "ada", **mcp}
    (home / "config.json").write_text(json.dumps(config))
    upulse("memory", "exchange", "ana", "hello there", "--home", home)
    return home


@asynccontextmanager
async def stdio_session(upulse: Upulse, home: Path) -> AsyncIterator[ClientSession]:
    """An initialised client session with `upulse mcp` on stdio."""
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "pulse_cli", "mcp", "--home", str(home)],
                                   env=upulse.env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@contextmanager
def http_server(upulse: Upulse, home: Path) -> Iterator[str]:
    """`upulse mcp --http --port 0` running; yields its endpoint URL, read from the line it
    prints once it listens. Stopped (SIGTERM, then SIGKILL) on exit."""
    child = subprocess.Popen(
        [sys.executable, "-m", "pulse_cli", "mcp", "--http", "--port", "0", "--home", str(home)],
        env=upulse.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        assert child.stderr is not None
        line = child.stderr.readline()
        assert "serving MCP on http://127.0.0.1:" in line, line + child.stderr.read()
        yield line.rsplit(" ", 1)[1].strip()
    finally:
        child.terminate()
        try:
            child.wait(timeout=scaled(10))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def token(home: Path) -> str:
    """The home's web UI token, which the HTTP transport wants as a bearer."""
    return (home / "ui.token").read_text().strip()


@asynccontextmanager
async def http_session(url: str, bearer: str) -> AsyncIterator[ClientSession]:
    """An initialised client session with `upulse mcp --http` at `url`."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {bearer}"},
                                 timeout=scaled(30)) as client, \
            streamable_http_client(url, http_client=client) as (read, write, _), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def session_over(transport: str, upulse: Upulse, home: Path
                       ) -> AsyncIterator[ClientSession]:
    """An initialised client session with `upulse mcp` over `transport`, stdio or http (a
    server of its own, with the home's token)."""
    if transport == "stdio":
        async with stdio_session(upulse, home) as session:
            yield session
        return
    with http_server(upulse, home) as url:
        async with http_session(url, token(home)) as session:
            yield session


def text(result: CallToolResult) -> str:
    """A tool result's text."""
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


async def events(home: Path, *kinds: str) -> list[Event]:
    """The home's events of `kinds`, read from another handle than the server's."""
    store = await SqliteEventStore.open(home / "events.db", read_only=True)
    try:
        return await store.read(kinds=list(kinds))
    finally:
        await store.close()


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
