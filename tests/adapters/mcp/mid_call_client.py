"""An MCP client that calls `remember` without end, several calls in flight at once, and
prints `done N` once call N's answer came back; the test kills it mid-call.

Usage: mid_call_client.py stdio HOME | mid_call_client.py http URL TOKEN
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

IN_FLIGHT = 8


@asynccontextmanager
async def session(args: list[str]) -> AsyncIterator[ClientSession]:
    if args[0] == "stdio":
        params = StdioServerParameters(command=sys.executable,
                                       args=["-m", "pulse_cli", "mcp", "--home", args[1]])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as opened:
            await opened.initialize()
            yield opened
        return
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {args[2]}"}) as client, \
            streamable_http_client(args[1], http_client=client) as (read, write, _), \
            ClientSession(read, write) as opened:
        await opened.initialize()
        yield opened


async def main(args: list[str]) -> None:
    numbers = itertools.count()

    async def caller(opened: ClientSession) -> None:
        for n in numbers:
            done = await opened.call_tool("remember", {"identity": "ana", "text": f"fact {n}"})
            if not done.isError:
                print(f"done {n}", flush=True)

    async with session(args) as opened:
        await asyncio.gather(*(caller(opened) for _ in range(IN_FLIGHT)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
