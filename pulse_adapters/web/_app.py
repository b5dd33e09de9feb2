"""The UI's Starlette app: its own pages and the layers' pages, static files, the JSON API,
live streams and /metrics, all behind the Guard (Host, cross-site, token)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from pulse_adapters.web import _drill, _memory, _page_routes, _rules, _vitals
from pulse_adapters.web import _views as views
from pulse_adapters.web._book import FleetBook, LogBook
from pulse_adapters.web._guard import Guard, allowed_hosts
from pulse_adapters.web._metrics import EngineMetrics
from pulse_adapters.web._query import BadQuery, newest, number, parse_filter
from pulse_adapters.web._responses import json_response, live, problem
from pulse_adapters.web._settings import WebSettings
from pulse_adapters.web._state import WebState
from pulse_adapters.web._stream import Beat, Feed, event_stream, stream_families, vitals_stream
from pulse_adapters.web._view import UI_PAGES, EngineView
from pulse_core import EffectNotFound, EffectStatus, PulseError

STATIC = Path(str(files("pulse_adapters.web") / "static"))
FILES = {"/": "overview.html"}
"""The file of each of the UI's own pages whose name is not its path's."""


def _params(request: Request) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, value in request.query_params.multi_items():
        found.setdefault(name, []).append(value)
    return found


async def overview(state: WebState) -> dict[str, Any]:
    """What the Overview page shows (also streamed every `live_every_s`)."""
    engine = state.engine
    await state.book.catch_up(frozenset(engine.report.survival_tags))
    keys = [w.key for w in engine.watchers]
    latest = await engine.vitals.latest(keys)
    return {
        "engine": {"ticks": engine.ticks, "last_tick_at": engine.last_tick_at,
                   "tick_ms": engine.last_tick_ms, "next_tick_at": engine.next_tick_at,
                   "ticks_per_minute": state.tick_rate.per_minute(engine.ticks),
                   "started_at": engine.started_at, "host": engine.placement,
                   "revision": views.revision(state.home), "seq": state.book.seq,
                   "now": engine.clock.now_ms()},
        "effects": views.effect_counts(state.book),
        "loops": [msgspec.to_builtins(s) for s in engine.loops()],
        "survival": list(reversed(state.book.survival))[:20],
        "watchers": [{"key": key, "ts": s.ts if s else None, "ok": s.ok if s else None,
                      "data": s.data if s else None, "error": s.error if s else None}
                     for key in keys for s in [latest.get(key)]],
    }


def _routes(state: WebState) -> list[BaseRoute]:
    engine = state.engine
    overview_beat = Beat("overview", state.settings.live_every_s, lambda: overview(state))

    async def page(request: Request) -> Response:
        path = request.url.path
        return FileResponse(STATIC / FILES.get(path, f"{path.strip('/')}.html"))

    async def api_overview(request: Request) -> Response:
        return json_response(await overview(state))

    async def api_events(request: Request) -> Response:
        try:
            f = parse_filter(_params(request), views.EVENT_PAGE_MAX)
        except BadQuery as exc:
            return problem(400, str(exc))
        if f.effects:
            await state.book.catch_up(frozenset(engine.report.survival_tags))
            found, older = await views.effects_in(engine, state.book, frozenset(f.effects),
                                                  f.before, f.limit)
        else:
            found, older = await newest(engine.events, f)
        return json_response({"events": [views.event_json(e) for e in found],
                              "older": older, "head": await engine.events.last_seq()})

    async def api_event(request: Request) -> Response:
        seq = request.path_params["seq"]
        detail = await views.event_detail(engine, seq) if seq < 2**63 else None
        return problem(404, "no such event") if detail is None else json_response(detail)

    async def api_effects(request: Request) -> Response:
        await state.book.catch_up(frozenset(engine.report.survival_tags))
        status = request.query_params.get("status") or None
        if status is not None and status not in EffectStatus.__members__.values():
            return problem(400, f"status={status!r}: give one of "
                                 f"{', '.join(str(s) for s in EffectStatus)}")
        return json_response({"effects": views.effects(state.book, status, 500),
                      "counts": views.effect_counts(state.book)})

    async def api_tasks(request: Request) -> Response:
        return json_response({"tasks": await views.tasks(engine)})

    async def control(request: Request) -> Response:
        body = await _body(request)
        if isinstance(body, Response):
            return body
        action = request.path_params["action"]
        try:
            event = await views.control_effect(engine, action, request.path_params["id"],
                                               str(body.get("reason") or f"{action} from the UI"))
        except (views.NotFound, EffectNotFound) as exc:
            return problem(404, str(exc))
        except PulseError as exc:
            return problem(409, str(exc))
        return json_response(views.event_json(event))

    async def metrics(request: Request) -> Response:
        return Response(await state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def stream_events(request: Request) -> Response:
        try:
            f = parse_filter(_params(request), views.EVENT_PAGE_MAX)
        except BadQuery as exc:
            return problem(400, str(exc))
        resume = request.headers.get("last-event-id") or request.query_params.get("after")
        after = number(resume)
        if after is None:
            after = await engine.events.last_seq()
        return live(event_stream(state.feed, f, after))

    async def stream_overview(request: Request) -> Response:
        return live(overview_beat.stream())

    async def stream_vitals(request: Request) -> Response:
        return live(vitals_stream(engine.vitals, state.settings.live_every_s))

    return [
        *(Route(path, page) for path, _ in UI_PAGES),
        Route("/api/overview", api_overview),
        Route("/api/events", api_events),
        Route("/api/events/{seq:int}", api_event),
        Route("/api/effects", api_effects),
        Route("/api/effects/{id}/{action:str}", control, methods=["POST"]),
        Route("/api/tasks", api_tasks),
        Route("/metrics", metrics),
        Route("/stream/events", stream_events),
        Route("/stream/overview", stream_overview),
        Route("/stream/vitals", stream_vitals),
        *_vitals.routes(state),
        *_drill.routes(state, STATIC),
        *_rules.routes(state),
        *_memory.routes(state),
        *_page_routes.routes(state, STATIC),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]


async def _body(request: Request) -> dict[str, Any] | Response:
    """A JSON object body ({} when empty), or the 400 response saying what is wrong."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        return problem(400, f"the body is not JSON: {exc}")
    return body if isinstance(body, dict) else problem(400, "the body must be a JSON object")


def build_app(engine: EngineView, settings: WebSettings, token: str, port: int) -> Starlette:
    """The UI of `engine` on `port`, guarded by `token`."""
    feed = Feed(engine.events, views.event_json)
    state = WebState(engine, settings, LogBook(engine.events), feed,
                     EngineMetrics(engine, readings=lambda: engine.report.instruments,
                                   extra=lambda: stream_families(feed),
                                   metrics=engine.pages.metrics), FleetBook(engine.events))
    hosts = allowed_hosts(port, settings.allowed_hosts, settings.host)
    guard = Middleware(Guard, token=token, hosts=hosts, cookie=f"pulse_ui_{port}")
    return Starlette(routes=_routes(state), middleware=[guard])
