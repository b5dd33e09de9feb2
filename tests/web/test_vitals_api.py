"""The Vitals API and its charts: keys with their latest sample and units, series over 15 min /
6 h / 7 d downsampled without losing a spike, failed samples marked and breaking the line,
SVG charts and sparklines that parse and have one marker per point, axis labels with units,
and bad input answered with what was wrong and what is allowed. Samples are real, recorded
into a real engine's VitalsStore; one test goes through the real uvicorn server."""

from __future__ import annotations

import asyncio
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from pulse_adapters.web import WebSettings, build_app, layer, read_token
from pulse_adapters.web._charts import unit_of, value_ticks
from pulse_adapters.web._report import EngineReport
from pulse_adapters.web._view import EngineView
from pulse_adapters.web._vitals import POINTS_MAX
from pulse_core import Engine, LayerContext, ManualClock, SystemClock, Watcher

SVG = "{http://www.w3.org/2000/svg}"
TOKEN = "vitals-test-token-" + "x" * 24
PORT = 8421
MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
HH_MM = re.compile(r"^\d\d:\d\d$")
DAY_HH_MM = re.compile(r"^[A-Z][a-z]{2} \d\d:\d\d$")


class Gauges(Watcher):
    """A real watcher whose one collect the tests take with `engine.sample()`."""

    name = "gauges"
    interval = 3600.0

    async def collect(self) -> dict[str, Any]:
        return {"cpu_pct": 12.5, "rss_bytes": 3 * 2**20, "net": {"latency_ms": 4.0},
                "label": "text"}


@dataclass
class Rig:
    engine: Engine
    clock: ManualClock
    http: httpx.AsyncClient

    async def record(self, key: str, data: Any = None, *, ago_ms: int,
                     error: str | None = None) -> None:
        await self.engine.vitals.record(key, data, error=error,
                                        ts=self.clock.now_ms() - ago_ms)

    async def json(self, path: str, status: int = 200) -> Any:
        response = await self.http.get(path)
        assert response.status_code == status, response.text
        return response.json()

    async def svg(self, path: str) -> ET.Element:
        response = await self.http.get(path)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "image/svg+xml"
        return ET.fromstring(response.text)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    """The UI's app over a real engine's stores (its clock held still), served in-process."""
    clock = ManualClock()
    engine = Engine(tmp_path / "home", watchers=[Gauges()], clock=clock)
    await engine.open()
    view = EngineView.beside(engine)
    view.update(EngineReport(watchers=tuple(w.key for w in engine.watchers)))
    app = build_app(view, WebSettings(port=PORT), TOKEN, PORT)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                 base_url=f"http://127.0.0.1:{PORT}",
                                 headers={"authorization": f"Bearer {TOKEN}"}) as http:
        try:
            yield Rig(engine, clock, http)
        finally:
            await engine.close()


def points(root: ET.Element) -> list[ET.Element]:
    return [c for c in root.iter(f"{SVG}circle") if c.get("class") == "point"]


def marked(root: ET.Element, name: str) -> list[ET.Element]:
    return [e for e in root.iter() if e.get("class") == name]


def tick_labels(root: ET.Element, axis: str) -> list[str]:
    group = next(g for g in root.iter(f"{SVG}g") if g.get("class") == axis)
    return [t.text or "" for t in group.iter(f"{SVG}text")]


async def test_keys_list_the_watchers_first_with_latest_sample_and_units(rig: Rig) -> None:
    await rig.engine.sample()
    await rig.record("aaa-stored", {"uptime_s": 5}, ago_ms=1_000)
    found = await rig.json("/api/vitals/keys")
    watched = [w.key for w in rig.engine.watchers]  # the survival layer's, and gauges
    assert "gauges" in watched
    assert [k["key"] for k in found["keys"]] == [*watched, "aaa-stored"]
    by_key = {k["key"]: k for k in found["keys"]}
    gauges = by_key["gauges"]
    assert gauges["watcher"] is True and by_key["aaa-stored"]["watcher"] is False
    assert gauges["latest"]["ok"] is True and gauges["latest"]["data"]["label"] == "text"
    assert gauges["fields"] == [
        {"name": "cpu_pct", "unit": "percent", "value": 12.5},
        {"name": "rss_bytes", "unit": "bytes", "value": 3 * 2**20},
        {"name": "net.latency_ms", "unit": "ms", "value": 4.0}]
    assert found["windows"] == ["15m", "6h", "7d"]


async def test_a_downsampled_series_keeps_each_buckets_min_and_max(rig: Rig) -> None:
    count = 1_500
    for i in range(count):
        value = 99.0 if i == 700 else -5.0 if i == 900 else 10.0
        await rig.record("k", {"load": value}, ago_ms=(count - i) * 14_000)
    found = await rig.json("/api/vitals?key=k&window=6h")
    line = found["fields"]["load"]["points"]
    assert found["samples"] == count and found["bucket_ms"] > 0
    assert 500 <= len(line) <= POINTS_MAX
    assert sum(p["n"] for p in line) == count
    spike = next(p for p in line if p["max"] == 99.0)
    assert spike["n"] > 1 and spike["mean"] < 99.0  # the mean alone would hide it
    assert min(p["min"] for p in line) == -5.0
    assert all(p["min"] <= p["mean"] <= p["max"] for p in line)


async def test_each_window_returns_only_its_samples(rig: Rig) -> None:
    for ago in (1 * MINUTE, 10 * MINUTE, 20 * MINUTE, 3 * HOUR, 2 * DAY, 8 * DAY):
        await rig.record("k", {"load": ago / MINUTE}, ago_ms=ago)
    now = rig.clock.now_ms()
    for window, span, loads in (("15m", 15 * MINUTE, [10, 1]), ("6h", 6 * HOUR, [180, 20, 10, 1]),
                                ("7d", 7 * DAY, [2880, 180, 20, 10, 1])):
        found = await rig.json(f"/api/vitals?key=k&window={window}")
        assert (found["since"], found["until"]) == (now - span, now)
        assert [p["mean"] for p in found["fields"]["load"]["points"]] == loads
        assert found["bucket_ms"] == 0  # few samples: each is a point


async def test_failed_samples_are_listed_and_break_the_line(rig: Rig) -> None:
    for i in range(10):
        ago = (10 - i) * 30_000
        if i == 4:
            await rig.record("k", error="sensor gone", ago_ms=ago)
        else:
            await rig.record("k", {"a": i, **({"b": i} if i != 7 else {})}, ago_ms=ago)
    found = await rig.json("/api/vitals?key=k&window=15m")
    assert found["failed"] == 1
    assert found["failures"] == [{"t": rig.clock.now_ms() - 6 * 30_000,
                                  "error": "sensor gone", "n": 1}]
    a, b = found["fields"]["a"]["points"], found["fields"]["b"]["points"]
    assert [p["mean"] for p in a if p["gap"]] == [5]
    assert [p["mean"] for p in b if p["gap"]] == [5, 8]  # 7 lacked b: its line breaks too
    only = await rig.json("/api/vitals?key=k&window=15m&field=b")
    assert list(only["fields"]) == ["b"]


async def test_a_chart_has_one_marker_per_point_and_breaks_where_samples_failed(
        rig: Rig) -> None:
    for i in range(37):
        ago = (37 - i) * 20_000
        if i == 20:
            await rig.record("gauges", error="probe failed", ago_ms=ago)
        else:
            await rig.record("gauges", {"cpu_pct": 30 + i}, ago_ms=ago)
    root = await rig.svg("/api/vitals/chart.svg?key=gauges&field=cpu_pct&window=15m")
    assert len(points(root)) == int(root.get("data-points", "")) == 36
    assert len(marked(root, "failed")) == int(root.get("data-failures", "")) == 1
    assert len(marked(root, "line")) == 2  # the line stops before the failure, then resumes
    title = root.find(f"{SVG}title")
    assert title is not None and title.text == "gauges · cpu_pct (%) — last 15 min"
    assert all(label.endswith("%") for label in tick_labels(root, "y-axis"))
    x_labels = tick_labels(root, "x-axis")
    assert len(x_labels) >= 4 and all(HH_MM.match(label) for label in x_labels)


async def test_a_chart_of_a_busy_week_is_downsampled_and_labelled_by_day(rig: Rig) -> None:
    count = 1_400
    for i in range(count):
        await rig.record("k", {"rss_bytes": (200 + i % 50) * 2**20},
                         ago_ms=(count - i) * 400_000)
    found = await rig.json("/api/vitals?key=k&window=7d&field=rss_bytes")
    root = await rig.svg("/api/vitals/chart.svg?key=k&field=rss_bytes&window=7d")
    assert len(points(root)) == len(found["fields"]["rss_bytes"]["points"]) <= POINTS_MAX
    assert marked(root, "band")  # min..max of each bucket
    assert all(label.endswith(" MiB") for label in tick_labels(root, "y-axis"))
    x_labels = tick_labels(root, "x-axis")
    assert len(x_labels) >= 5 and all(DAY_HH_MM.match(label) for label in x_labels)


@pytest.mark.parametrize(("data", "field", "suffix"), [
    ({"latency_ms": 250}, "latency_ms", " ms"),
    ({"latency_ms": 4_500}, "latency_ms", " s"),
    ({"uptime_s": 9_000}, "uptime_s", " h"),
    ({"disk_pct": {"/home": 55}}, "disk_pct./home", "%"),
    ({"queue": 25_000}, "queue", "k"),
])
async def test_value_axis_labels_carry_the_fields_unit(rig: Rig, data: dict[str, Any],
                                                      field: str, suffix: str) -> None:
    await rig.record("k", data, ago_ms=60_000)
    await rig.record("k", data, ago_ms=30_000)
    root = await rig.svg(f"/api/vitals/chart.svg?key=k&field={field}&window=15m")
    labels = tick_labels(root, "y-axis")
    assert labels and all(label.endswith(suffix) for label in labels), labels


def test_units_come_from_field_names() -> None:
    assert [unit_of(name) for name in (
        "cpu_pct", "memory_percent", "disk_pct./home", "rss_bytes", "net.latency_ms",
        "uptime_s", "wait_seconds", "up", "count", "dns.example.com.latency_ms")] == [
        "percent", "percent", "percent", "bytes", "ms", "s", "s", "", "", "ms"]


def test_value_ticks_cover_the_data_on_round_numbers() -> None:
    ticks = value_ticks(3.0, 97.0, "percent")
    assert ticks.low <= 3.0 and ticks.high >= 97.0 and ticks.labels[-1] == "100%"
    gib = value_ticks(0.0, 3 * 2**30, "bytes")
    assert gib.labels == ["0 GiB", "1 GiB", "2 GiB", "3 GiB"]
    flat = value_ticks(42.0, 42.0, "")
    assert flat.low < 42.0 < flat.high


async def test_a_sparkline_is_valid_with_and_without_numbers(rig: Rig) -> None:
    for i in range(5):
        await rig.record("gauges", {"label": "busy", "load": i, "cpu_pct": 2 * i},
                         ago_ms=(5 - i) * 60_000)
    await rig.record("words", {"label": "no numbers here"}, ago_ms=60_000)
    await rig.record("broken", error="down", ago_ms=60_000)
    spark = await rig.svg("/api/vitals/spark.svg?key=gauges&t=123")
    assert spark.get("data-points") == "5" and spark.get("width") == "160"
    assert "load" in (spark.get("aria-label") or "")  # the first numeric field by default
    assert [e.tag for e in spark.iter(f"{SVG}polyline")] == [f"{SVG}polyline"]
    chosen = await rig.svg("/api/vitals/spark.svg?key=gauges&field=cpu_pct")
    assert "cpu_pct" in (chosen.get("aria-label") or "")
    for key, failures in (("words", "0"), ("broken", "1")):
        empty = await rig.svg(f"/api/vitals/spark.svg?key={key}")
        assert empty.get("data-points") == "0" and empty.get("data-failures") == failures
        assert not list(empty.iter(f"{SVG}polyline"))


@pytest.mark.parametrize(("path", "status", "names"), [
    ("/api/vitals?key=nope", 404, ["'nope'", "'gauges'"]),
    ("/api/vitals", 400, ["`key` is required", "'gauges'"]),
    ("/api/vitals?key=gauges&window=1h", 400, ["'1h'", "'15m'", "'6h'", "'7d'"]),
    ("/api/vitals?key=gauges&field=label", 400, ["'label'", "'cpu_pct'", "'net.latency_ms'"]),
    ("/api/vitals/chart.svg?key=gauges&window=15m", 400, ["`field` is required"]),
    ("/api/vitals/chart.svg?key=gauges&field=cpu_pct&window=2d", 400, ["'2d'", "'7d'"]),
    ("/api/vitals/chart.svg?key=gauges&field=nope", 400, ["'nope'", "'rss_bytes'"]),
    ("/api/vitals/spark.svg?key=nope", 404, ["'nope'"]),
    ("/api/vitals/spark.svg?key=gauges&field=label", 400, ["'label'", "'cpu_pct'"]),
])
async def test_bad_input_names_what_was_wrong_and_what_is_allowed(
        rig: Rig, path: str, status: int, names: list[str]) -> None:
    await rig.engine.sample()
    error = (await rig.json(path, status))["error"]
    for name in names:
        assert name in error


async def test_a_field_of_the_latest_sample_charts_an_empty_window(rig: Rig) -> None:
    await rig.record("k", {"load": 1}, ago_ms=2 * HOUR)
    root = await rig.svg("/api/vitals/chart.svg?key=k&field=load&window=15m")
    assert root.get("data-points") == "0" and marked(root, "empty")
    found = await rig.json("/api/vitals?key=k&window=6h&field=load")
    assert len(found["fields"]["load"]["points"]) == 1


async def test_the_served_ui_charts_a_watchers_samples(tmp_path: Path) -> None:
    home = tmp_path / "home"
    web = layer({"port": 0}, LayerContext(home, SystemClock()))
    async with Engine(home, layers=[web], watchers=[Gauges()]) as engine:
        address = home / "web.json"
        for _ in range(300):
            if address.exists():
                break
            await asyncio.sleep(0.05)
        url = json.loads(address.read_text())["url"]
        now = engine.clock.now_ms()
        for i in range(12):
            await engine.vitals.record("gauges", {"cpu_pct": 5.0 * i}, ts=now - i * 30_000)
        await engine.vitals.record("gauges", error="probe failed", ts=now - 400_000)
        recorded = await engine.vitals.window("gauges", now - 15 * MINUTE)
        expected = sum(1 for s in recorded if s.ok and "cpu_pct" in s.data)
        async with httpx.AsyncClient(base_url=url, headers={
                "authorization": f"Bearer {read_token(home)}"}) as http:
            keys = (await http.get("api/vitals/keys")).json()["keys"]
            assert [k["key"] for k in keys if k["watcher"]] == [w.key for w in engine.watchers]
            chart = await http.get("api/vitals/chart.svg?key=gauges&field=cpu_pct&window=15m")
            assert chart.status_code == 200, chart.text
            root = ET.fromstring(chart.text)
            assert len(points(root)) == int(root.get("data-points", "")) == expected >= 12
            assert len(marked(root, "failed")) == 1
            spark = await http.get("api/vitals/spark.svg?key=gauges")
            assert ET.fromstring(spark.text).get("data-points") == str(expected)
            page = await http.get("vitals")
            assert page.status_code == 200 and "/static/vitals.js" in page.text
            script = await http.get("static/vitals.js")
            assert script.status_code == 200 and "/stream/vitals" in script.text
            refused = await httpx.AsyncClient().get(f"{url}api/vitals/keys")
            assert refused.status_code == 401


class RouteProbe(Gauges):
    """A watcher writing `llm-route`, as the awareness and Hermes layers' route probes both
    do under names of their own."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.key = "llm-route"
        super().__init__()


async def test_a_key_two_watchers_write_is_listed_once(tmp_path: Path) -> None:
    clock = ManualClock()
    engine = Engine(tmp_path / "home", watchers=[RouteProbe("review-route"), Gauges(),
                                                  RouteProbe("hermes-route")],
                    clock=clock)
    await engine.open()
    view = EngineView.beside(engine)
    view.update(EngineReport(watchers=tuple(w.key for w in engine.watchers)))
    app = build_app(view, WebSettings(port=PORT), TOKEN, PORT)
    try:
        await engine.sample()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url=f"http://127.0.0.1:{PORT}",
                                     headers={"authorization": f"Bearer {TOKEN}"}) as http:
            keys = [k["key"] for k in (await http.get("/api/vitals/keys")).json()["keys"]]
            overview = (await http.get("/api/overview")).json()
    finally:
        await engine.close()
    assert [w.key for w in engine.watchers].count("llm-route") == 2
    assert keys.count("llm-route") == 1 and keys.count("gauges") == 1
    assert [w["key"] for w in overview["watchers"]].count("llm-route") == 1
