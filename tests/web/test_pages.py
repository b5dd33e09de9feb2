"""A layer's own pages in the web UI (Layer.ui): listed in the nav's one list, served behind
the guard, their projections folded by the UI (never by the engine); the UI's process builds
the layers config.json names to learn them, and one that cannot be built there leaves the
others served with its error said. The UI itself names no layer and imports no other package
of pulse."""

from __future__ import annotations

import ast
import asyncio
import json
import queue
import re
import threading
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from playwright.sync_api import Page as BrowserPage

import pulse_adapters.web
from pulse_adapters.web import layer as web_layer
from pulse_adapters.web._pages import configured_pages
from pulse_adapters.web._view import RESERVED
from pulse_core import (
    Engine,
    Event,
    EventDraft,
    Layer,
    LayerContext,
    LayerError,
    PageRequest,
    Projection,
    SystemClock,
    UiPage,
    register_kind,
)
from tests.web.conftest import LIVE_S, wait_for
from tests.web.test_rules_api import served, ui_of, until

register_kind("web-test-visit", "a visit the page-test layer counts; key: visitor:<name>")


class Visits(Projection[dict[str, int]]):
    """Visits per visitor: read by the page alone, never by the engine's rules."""

    name = "web-test-visits"
    kinds = frozenset({"web-test-visit"})

    def initial(self) -> dict[str, int]:
        return {}

    def apply(self, state: dict[str, int], event: Event) -> dict[str, int]:
        return {**state, event.key: state.get(event.key, 0) + 1}


async def visits(request: PageRequest) -> dict[str, Any]:
    if request.query.get("visitor") == "nobody":
        raise LookupError("nobody visited")
    counted = request.snapshot.state(Visits)
    return {"visitors": [{"name": k, "visits": n} for k, n in sorted(counted.items())],
            "layers": list(request.layers)}


def visiting_layer() -> Layer:
    return Layer("visiting", ui=[UiPage("visits", "Visits", visits, projections=[Visits()])])


async def visit(engine: Engine, *who: str) -> None:
    await engine.append([EventDraft("web-test-visit", f"visitor:{name}", {}, origin="human")
                         for name in who])


async def test_a_layers_page_is_in_the_nav_and_its_view_answers_through_the_guard(
        tmp_path: Path) -> None:
    async with Engine(tmp_path / "home", layers=[visiting_layer()]) as engine:
        await visit(engine, "ana", "ana", "bo")
        async with ui_of(engine, has_directory=False) as http:
            listed = (await http.get("/api/pages")).json()
            page = (await http.get("/api/pages/visits")).json()
            missing = await http.get("/api/pages/visits?visitor=nobody")
            html = await http.get("/visits")
            refused = await http.get("/api/pages/visits", headers={"authorization": "Bearer x"})
        snapshot = await engine.snapshot()
    paths = [(p["path"], p["title"], p["layer"]) for p in listed["pages"]]
    assert paths[0] == ("/", "Overview", None)
    assert ("/processes", "Processes", "survival") in paths  # the survival layer's own
    assert paths[-1] == ("/visits", "Visits", "visiting") and listed["problems"] == []
    assert page["visitors"] == [{"name": "visitor:ana", "visits": 2},
                                {"name": "visitor:bo", "visits": 1}]
    assert missing.status_code == 404 and missing.json() == {"error": "nobody visited"}
    assert html.status_code == 200 and "/static/page.js" in html.text  # the generic page
    assert refused.status_code == 401
    assert Visits.name not in snapshot.projections  # folded by the UI, not by the engine


async def test_a_page_whose_slug_is_taken_is_left_out_and_said_why(tmp_path: Path) -> None:
    async def empty(request: PageRequest) -> dict[str, Any]:
        return {}

    twice = Layer("twice", ui=[UiPage("visits", "Again", empty),
                               UiPage("events", "Mine", empty)])
    async with (Engine(tmp_path / "home", layers=[visiting_layer(), twice]) as engine,
                ui_of(engine, has_directory=False) as http):
        listed = (await http.get("/api/pages")).json()
        events = await http.get("/events")
    assert [p["title"] for p in listed["pages"] if p["layer"] == "twice"] == []
    assert listed["problems"] == [
        "layer 'twice': page 'visits' is left out: /visits is layer 'visiting''s page — give "
        "the page another slug",
        "layer 'twice': page 'events' is left out: /events is the UI's own page — give the "
        "page another slug"]
    assert "pulse · Events" in events.text


def test_a_page_slug_that_is_not_a_path_is_refused_when_the_layer_is_built() -> None:
    async def empty(request: PageRequest) -> dict[str, Any]:
        return {}

    for slug in ("Visits", "a/b", "", "-x"):
        try:
            UiPage(slug, "T", empty)
        except LayerError as exc:
            assert repr(slug) in str(exc) and "lowercase" in str(exc)
        else:
            raise AssertionError(f"slug {slug!r} was taken")


async def test_the_ui_process_serves_the_pages_of_the_layers_it_can_build_and_names_the_other(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.json").write_text(json.dumps({"layers": {
        "web": {"port": 0, "live_every_s": 0.2}, "maintenance": {},
        "cursor": {"agents": "not a list"}}}))
    web = web_layer({"port": 0, "live_every_s": 0.2}, LayerContext(home, SystemClock()))
    async with Engine(home, layers=[web]):  # built in code: the UI reads config.json
        url, token = await served(home)
        async with httpx.AsyncClient(headers=token, timeout=30) as http:
            listed = (await http.get(url + "api/pages")).json()
            maintenance = await http.get(url + "api/pages/maintenance")
            cursor = await http.get(url + "api/pages/cursor-runs")
    layers = {p["layer"] for p in listed["pages"]}
    assert {"survival", "maintenance"} <= layers and "cursor" not in layers
    (problem,) = listed["problems"]
    assert problem.startswith("layer 'cursor' could not be built in the UI's process, its "
                              "pages are not shown: ")
    assert "agents" in problem
    assert maintenance.status_code == 200 and maintenance.json()["cycles"] == []
    assert cursor.status_code == 404


async def test_a_layers_page_in_the_ui_process_reads_what_the_engine_appends(
        tmp_path: Path) -> None:
    """The maintenance page's projection is folded in the UI's process, from the log."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.json").write_text(json.dumps({"layers": {"maintenance": {}}}))
    web = web_layer({"port": 0, "live_every_s": 0.2}, LayerContext(home, SystemClock()))
    async with Engine(home, layers=[web]) as engine:
        url, token = await served(home)
        await engine.append([EventDraft("maintenance-requested", "maintenance:requests",
                                        {"reason": "from the test"}, origin="human")])
        async with httpx.AsyncClient(headers=token, timeout=30) as http:
            async def requested() -> dict[str, Any] | None:
                page = (await http.get(url + "api/pages/maintenance")).json()
                return page if page["last_request"] else None

            page = await until(requested, "the request on the maintenance page")
    assert page["last_request"] == "from the test"


def test_building_the_configured_layers_starts_no_process_and_opens_no_file(
        tmp_path: Path) -> None:
    """What the UI's process does to learn the pages: factories only build."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.json").write_text(json.dumps({
        "survival": {"processes": [{"name": "p", "argv": ["sleep", "1"], "pidfile": "x"}]},
        "layers": {"web": {}, "maintenance": {}, "cursor": {"agents": [
            {"name": "coder", "repo": str(tmp_path)}]},
            "awareness": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}}}))
    me = psutil.Process()

    def files() -> set[tuple[str, int]]:
        return {(f.path, f.fd) for f in me.open_files()}

    # an earlier test's process or thread may still be ending (closing its files, being
    # reaped), or writing (its files' positions move): only what this build adds is judged
    files_before, children_before = files(), set(me.children(recursive=True))
    pages = configured_pages(home, "", RESERVED)
    assert pages.problems == ()
    assert [p.page.slug for p in pages.pages] == ["processes", "maintenance", "cursor-runs",
                                                   "reviewer"]
    assert set(me.children(recursive=True)) - children_before == set()
    assert files() - files_before == set()
    assert sorted(p.name for p in home.iterdir()) == ["config.json"]  # nothing written


LAYER_NAMES = re.compile(r"\b(awareness|maintenance|openclaw|hermes|reviewer)\b", re.I)


def test_the_web_package_names_no_layer_and_imports_no_other_package_of_pulse() -> None:
    root = Path(pulse_adapters.web.__file__).parent
    imported: list[str] = []
    for source in root.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.append(node.module)
            elif isinstance(node, ast.Import):
                imported += [alias.name for alias in node.names]
    ours = {m.split(".")[0] if not m.startswith("pulse_adapters.") else
            ".".join(m.split(".")[:2]) for m in imported if m.startswith("pulse")}
    assert ours <= {"pulse_core", "pulse_adapters.web"}, ours
    named = [f"{path.relative_to(root)}: {match}"
             for path in sorted(root.rglob("*")) if path.suffix in (".py", ".js", ".html")
             for match in LAYER_NAMES.findall(path.read_text())]
    assert named == []


@pytest.mark.slow
def test_in_the_browser_a_layer_the_ui_cannot_build_is_named_under_the_nav(
        page: BrowserPage, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.json").write_text(json.dumps({"layers": {
        "web": {"port": 0}, "maintenance": {}, "cursor": {"agents": "not a list"}}}))
    web = web_layer({"port": 0, "live_every_s": 0.2}, LayerContext(home, SystemClock()))
    address: queue.Queue[tuple[str, str]] = queue.Queue()
    stop = threading.Event()

    async def serve() -> None:
        async with Engine(home, layers=[web]):
            url, token = await served(home)
            address.put((url, token["authorization"].removeprefix("Bearer ")))
            while not stop.is_set():  # noqa: ASYNC110 - the browser works in another thread
                await asyncio.sleep(0.05)

    engine = threading.Thread(target=asyncio.run, args=(serve(),))
    engine.start()
    try:
        url, token = address.get(timeout=60)
        page.goto(f"{url}maintenance?token={token}")
        problems = page.locator("#page-problems li")
        wait_for(lambda: problems.count() == 1, LIVE_S, "the layer's problem under the nav")
        assert problems.inner_text().startswith("layer 'cursor' could not be built in the UI's "
                                                "process")
        assert page.locator('#nav a[data-layer="maintenance"]').inner_text() == "Maintenance"
        assert page.locator('#nav a[data-layer="cursor"]').count() == 0
        cycles = page.locator('[data-field="cycles"]')
        wait_for(lambda: cycles.count() == 1, LIVE_S, "the maintenance page's cycles")
    finally:
        stop.set()
        engine.join(timeout=60)
