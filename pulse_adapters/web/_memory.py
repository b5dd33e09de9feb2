"""The Memory page's API: the agent's memory as an operator reads it (pulse_core's memory read
model, `summarise_identities` and `read_identity`).

GET /api/memory lists every identity with its record counts and newest exchange, from the
`Memory` projection the UI's process folds. GET /api/memory/{identity} gives one identity's
current records with who wrote each and when, read from that identity's key in the log
(`shown` bounds the exchanges, observations, facts and removals listed; counts are always
whole). A forgotten or quarantined record shows only as a removal, never its content.
"""

from __future__ import annotations

import asyncio

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from pulse_adapters.web._query import number
from pulse_adapters.web._responses import problem
from pulse_adapters.web._state import WebState
from pulse_core import Memory, read_identity, summarise_identities

SHOWN_MAX = 500
"""The most records of each bounded type one request may list."""


def routes(state: WebState) -> list[BaseRoute]:
    """GET /api/memory and GET /api/memory/{identity}."""

    async def api_memory(request: Request) -> Response:
        memory = (await state.engine.snapshot()).state(Memory)
        found = await asyncio.to_thread(summarise_identities, memory, state.engine.events.keys)
        return JSONResponse({"identities": msgspec.to_builtins(found),
                             "kinds": sorted(Memory.kinds)})

    async def api_identity(request: Request) -> Response:
        identity = request.path_params["identity"]
        raw = request.query_params.get("shown")
        if raw is not None and (number(raw) is None or int(raw) > SHOWN_MAX):
            return problem(400, f"shown={raw!r}: give a number of records from 0 to "
                                f"{SHOWN_MAX}, or leave it out for the default")
        found = await (read_identity(state.engine.events, identity) if raw is None else
                       read_identity(state.engine.events, identity, shown=int(raw)))
        if found is None:
            return problem(404, f"no memory of identity {identity!r}: the list at "
                                "/api/memory names those the log holds")
        return JSONResponse(msgspec.to_builtins(found))

    return [Route("/api/memory", api_memory),
            Route("/api/memory/{identity:path}", api_identity)]
