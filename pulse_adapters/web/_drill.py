"""The drill-down's routes: the history of a key (`/history?key=K`, each event with its
causes; `&seq=S` centres it on event S) and the engines sharing the log (`/fleet`)."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Route

from pulse_adapters.web import _views as views
from pulse_adapters.web._query import number
from pulse_adapters.web._responses import json_response, problem
from pulse_adapters.web._state import WebState
from pulse_core import fleet_json


def routes(state: WebState, static: Path) -> list[BaseRoute]:
    """The history page and its JSON, and the fleet's JSON (`static`: the UI's own files)."""
    engine = state.engine

    async def history_page(request: Request) -> Response:
        return FileResponse(static / "history.html")

    async def api_history(request: Request) -> Response:
        key = request.query_params.get("key") or ""
        given = request.query_params.get("seq")
        seq = number(given)
        if not key:
            return problem(400, "key: give the key whose history to show (key=<effect id>)")
        if given is not None and seq is None:
            return problem(400, f"seq={given!r}: give the seq of an event of the key")
        return json_response(await views.history(engine, key, seq))

    async def api_fleet(request: Request) -> Response:
        await state.fleet.catch_up()
        now = engine.clock.now_ms()
        return json_response({"now": now, "engines": fleet_json(state.fleet.instances(now))})

    return [Route("/history", history_page), Route("/api/history", api_history),
            Route("/api/fleet", api_fleet)]
