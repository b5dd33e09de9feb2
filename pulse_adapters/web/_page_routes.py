"""The routes of the pages layers give the UI: each page at `/<slug>`, its JSON view at
`/api/pages/<slug>`, its actions at `POST /api/pages/<slug>/<action>`, its own files under
`/pages/<slug>/`, and the nav's list of every page (the UI's own, then the layers') with what
kept a layer's pages out, at `/api/pages`."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from pulse_adapters.web._pages import LayerPage
from pulse_adapters.web._responses import json_response, problem
from pulse_adapters.web._state import WebState
from pulse_adapters.web._view import UI_PAGES
from pulse_core import EffectEntry, PageAction, PageRequest, PulseError

ORIGIN = "web"
"""Who a page's action acts as: its events' origin is `human:web`, as the UI's other
controls'."""

GENERIC = "page.html"
"""The UI's page that draws a layer page's JSON when the page brings no files of its own."""


def page_list(state: WebState) -> dict[str, object]:
    """Every page in the nav's order (path, title, and the layer of a layer's page), and what
    kept a layer's pages out."""
    pages = [{"path": path, "title": title, "layer": None} for path, title in UI_PAGES]
    pages += [{"path": f"/{p.page.slug}", "title": p.page.title, "layer": p.layer}
              for p in state.engine.pages.pages]
    return {"pages": pages, "problems": list(state.engine.pages.problems)}


async def answered(found: LayerPage, call: Callable[[], Awaitable[Any]]) -> Response:
    """What a page's view or action gives, as JSON; its refusal (LookupError 404, ValueError
    400, another PulseError 409) or its failure (500) said with its message."""
    try:
        data = await call()
    except LookupError as exc:
        return problem(404, str(exc))
    except ValueError as exc:
        return problem(400, str(exc))
    except PulseError as exc:
        return problem(409, str(exc))
    except Exception as exc:  # a layer's bug: said on its page, the UI serves on
        return problem(500, f"layer {found.layer!r}: page {found.page.slug!r} failed: "
                            f"{type(exc).__name__}: {exc}")
    return json_response(data)


async def page_request(state: WebState, request: Request) -> PageRequest:
    """What a page's view is given for `request`."""
    engine = state.engine
    await state.book.catch_up(frozenset(engine.report.survival_tags))
    effects = state.book.effects

    def of_type(tag: str) -> list[EffectEntry]:
        return sorted((e for e in effects.values() if e.tag == tag), key=lambda e: e.seq,
                      reverse=True)

    return PageRequest(home=engine.home, events=engine.events, vitals=engine.vitals,
                       snapshot=await engine.snapshot(), now=engine.clock.now_ms(),
                       query=dict(request.query_params), layers=engine.report.layers,
                       effects=of_type)


def routes(state: WebState, static: Path) -> list[BaseRoute]:
    """The nav's list and each layer page's routes (`static`: the UI's own files)."""

    async def api_pages(request: Request) -> Response:
        return json_response(page_list(state))

    def html(found: LayerPage) -> Route:
        index = static / GENERIC if found.assets is None else found.assets / "index.html"

        async def page(request: Request) -> Response:
            return FileResponse(index)

        return Route(f"/{found.page.slug}", page)

    def view(found: LayerPage) -> Route:
        async def api_view(request: Request) -> Response:
            asked = await page_request(state, request)
            return await answered(found, lambda: found.page.view(asked))

        return Route(f"/api/pages/{found.page.slug}", api_view)

    def action(found: LayerPage, name: str, act: PageAction) -> Route:
        async def api_action(request: Request) -> Response:
            raw = await request.body()
            try:
                body = msgspec.json.decode(raw) if raw.strip() else None
            except msgspec.DecodeError as exc:
                return problem(400, f"the body is not JSON: {exc}")
            asked = dataclasses.replace(await page_request(state, request),
                                        append=state.engine.append, origin=ORIGIN)
            return await answered(found, lambda: act(asked, body))

        return Route(f"/api/pages/{found.page.slug}/{name}", api_action, methods=["POST"])

    found = state.engine.pages.pages
    return [
        Route("/api/pages", api_pages),
        *(html(p) for p in found),
        *(view(p) for p in found),
        *(action(p, name, act) for p in found for name, act in p.page.actions.items()),
        *(Mount(f"/pages/{p.page.slug}", StaticFiles(directory=p.assets))
          for p in found if p.assets is not None),
    ]
