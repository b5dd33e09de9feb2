"""The Vitals page's API: every vitals key with its latest sample, a key's numeric fields over
a window (15 min, 6 h, 7 d) downsampled to at most POINTS_MAX points per field, and the same
as an SVG chart or sparkline (pulse_adapters.web._charts).

A field is a number in a sample's data, nested objects flattened as `a.b` (the fields
/metrics exports, `vital_fields`). A window of more than POINTS_MAX samples is cut into
POINTS_MAX equal spans of time; each span's samples become one point with their smallest,
largest and mean value, so a spike stays visible. A failed sample is listed (bucketed the
same way) and breaks each field's line; so does an ok sample that lacks the field.
Samples are read through the VitalsStore (its worker thread) and downsampled in another
thread, so a week of samples never holds up the UI's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from pulse_adapters.web._charts import (
    Failure,
    FieldSeries,
    Point,
    chart_svg,
    spark_svg,
    unit_of,
)
from pulse_adapters.web._metrics import vital_fields
from pulse_adapters.web._responses import json_response, problem
from pulse_adapters.web._state import WebState
from pulse_core import Sample

WINDOWS_MS = {"15m": 15 * 60_000, "6h": 6 * 3_600_000, "7d": 7 * 86_400_000}
"""The windows a chart spans, by the name `window=` takes."""
WINDOW_TITLES = {"15m": "last 15 min", "6h": "last 6 h", "7d": "last 7 days"}
DEFAULT_WINDOW = "15m"
POINTS_MAX = 600
"""The most points per field a series or chart has."""
SPARK_POINTS_MAX = 160
"""The most points of a sparkline (about one per pixel)."""
UNIT_LABELS = {"percent": "%", "bytes": "bytes", "ms": "ms", "s": "s"}
SVG = "image/svg+xml"
Endpoint = Callable[[Request], Awaitable[Response]]


class Series(msgspec.Struct, frozen=True):
    """A key's numeric fields over [since, until] (ms): `bucket_ms` is the span of time each
    point stands for (0: each point is one sample), `samples` how many were read, `failures`
    the failed ones."""

    key: str
    window: str
    since: int
    until: int
    bucket_ms: int
    samples: int
    fields: dict[str, FieldSeries]
    failures: list[Failure]


class _Line:
    """One field's points as they are built: the open bucket's sums, whether the line breaks
    before it (`gap`), and whether it broke since it opened (`broken`: the next value starts
    a new point after a gap)."""

    __slots__ = ("broken", "bucket", "gap", "high", "low", "n", "points", "seen_at", "total",
                 "ts_sum")

    def __init__(self) -> None:
        self.points: list[Point] = []
        self.bucket = -1
        self.n = 0
        self.ts_sum = self.total = 0.0
        self.low = self.high = 0.0
        self.broken = False  # since the open bucket (or the last point) began
        self.gap = False  # before the open bucket
        self.seen_at = -1  # the index of the last sample that had this field

    def add(self, bucket: int, ts: int, value: float) -> None:
        if self.n and (bucket != self.bucket or self.broken):
            self.close()
        if not self.n:
            self.gap, self.broken = self.broken and bool(self.points), False
            self.bucket, self.low, self.high = bucket, value, value
        self.n += 1
        self.ts_sum += ts
        self.total += value
        self.low, self.high = min(self.low, value), max(self.high, value)

    def close(self) -> None:
        if self.n:
            self.points.append(Point(round(self.ts_sum / self.n), self.low, self.high,
                                     self.total / self.n, self.n, self.gap))
            self.n, self.ts_sum, self.total = 0, 0.0, 0.0


def downsample(samples: Sequence[Sample], since: int, until: int, most: int = POINTS_MAX,
               only: str | None = None) -> tuple[int, dict[str, FieldSeries], list[Failure]]:
    """(bucket span in ms, 0 when every sample is its own point; each numeric field's series,
    or only `only`'s; the failures) of `samples` (oldest first) over [since, until]."""
    bucket_ms = 0 if len(samples) <= most else -(-(until - since + 1) // most)
    lines: dict[str, _Line] = {}
    failures: list[Failure] = []
    failed_bucket = -1
    for index, sample in enumerate(samples):
        bucket = index if not bucket_ms else min((sample.ts - since) // bucket_ms, most - 1)
        if not sample.ok:
            if failures and failed_bucket == bucket:
                failures[-1] = Failure(failures[-1].t, failures[-1].error, failures[-1].n + 1)
            else:
                failures.append(Failure(sample.ts, str(sample.error)))
                failed_bucket = bucket
            for line in lines.values():
                line.broken = True
            continue
        for name, value in vital_fields(sample.data):
            if only is None or name == only:
                line = lines.get(name) or lines.setdefault(name, _Line())
                line.add(bucket, sample.ts, value)
                line.seen_at = index
        for line in lines.values():
            if line.seen_at != index:
                line.broken = True
    for line in lines.values():
        line.close()
    return bucket_ms, {name: FieldSeries(unit_of(name), line.points)
                       for name, line in lines.items()}, failures


def numeric_fields(samples: Sequence[Sample]) -> list[str]:
    """Every numeric field of `samples`, in the order they first appear."""
    found: dict[str, None] = {}
    for sample in samples:
        if sample.ok:
            found.update((name, None) for name, _ in vital_fields(sample.data))
    return list(found)


def sample_json(sample: Sample | None) -> dict[str, Any] | None:
    """A sample as the pages read it."""
    if sample is None:
        return None
    return {"ts": sample.ts, "ok": sample.ok, "data": sample.data, "error": sample.error}


class BadVitalsQuery(ValueError):
    """What was wrong with a request's parameters, and its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _listed(names: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in names) if names else "none yet"


class _Reader:
    """Reads what a request asks for, or raises BadVitalsQuery saying what is wrong."""

    def __init__(self, state: WebState) -> None:
        self.engine = state.engine

    async def known(self) -> tuple[list[str], dict[str, Sample]]:
        """Every vitals key (the engine's watchers first, then the store's) and the latest
        sample of each."""
        latest = await self.engine.vitals.latest()
        watched = [w.key for w in self.engine.watchers]
        return [*watched, *sorted(set(latest) - set(watched))], latest

    async def key(self, request: Request) -> tuple[str, Sample | None]:
        keys, latest = await self.known()
        key = request.query_params.get("key")
        if not key:
            raise BadVitalsQuery(400, f"`key` is required: one of {_listed(keys)}")
        if key not in keys:
            raise BadVitalsQuery(404, f"no vitals key {key!r}: the keys are {_listed(keys)}")
        return key, latest.get(key)

    @staticmethod
    def window(request: Request) -> str:
        window = request.query_params.get("window") or DEFAULT_WINDOW
        if window not in WINDOWS_MS:
            raise BadVitalsQuery(400, f"unknown window {window!r}: use "
                                      f"{_listed(list(WINDOWS_MS))}")
        return window

    async def series(self, key: str, latest: Sample | None, window: str, field: str | None,
                     most: int = POINTS_MAX) -> Series:
        """`key`'s series over `window` (only `field`'s when given: BadVitalsQuery when it is
        not a numeric field of the window's samples nor of the latest one)."""
        until = self.engine.clock.now_ms()
        since = until - WINDOWS_MS[window]
        samples = await self.engine.vitals.window(key, since)
        if samples:
            until = max(until, samples[-1].ts)
        bucket_ms, fields, failures = await asyncio.to_thread(
            downsample, samples, since, until, most, field)
        if field is not None and field not in fields:
            known = await asyncio.to_thread(
                numeric_fields, [*samples, *([latest] if latest else [])])
            if field not in known:
                raise BadVitalsQuery(400, f"{field!r} is not a numeric field of {key!r}: its "
                                          f"numeric fields are {_listed(known)}")
            fields = {field: FieldSeries(unit_of(field), [])}
        return Series(key, window, since, until, bucket_ms, len(samples), fields, failures)


def _title(key: str, field: str, window: str) -> str:
    unit = UNIT_LABELS.get(unit_of(field))
    return f"{key} · {field}{f' ({unit})' if unit else ''} — {WINDOW_TITLES[window]}"


def routes(state: WebState) -> list[BaseRoute]:
    """The Vitals page's API routes (see the module's docstring)."""
    reader = _Reader(state)

    async def keys(request: Request) -> Response:
        names, latest = await reader.known()
        watched = {w.key for w in state.engine.watchers}
        return json_response({
            "keys": [{"key": key, "watcher": key in watched,
                      "latest": sample_json(latest.get(key)),
                      "fields": [{"name": name, "unit": unit_of(name), "value": value}
                                 for name, value in vital_fields(sample.data if sample and
                                                                 sample.ok else None)]}
                     for key in names for sample in [latest.get(key)]],
            "windows": list(WINDOWS_MS), "now": state.engine.clock.now_ms()})

    async def series(request: Request) -> Response:
        key, latest = await reader.key(request)
        found = await reader.series(key, latest, reader.window(request),
                                    request.query_params.get("field") or None)
        failed = sum(f.n for f in found.failures)
        return json_response({**msgspec.to_builtins(found), "failed": failed,
                              "latest": sample_json(latest)})

    async def chart(request: Request) -> Response:
        key, latest = await reader.key(request)
        window = reader.window(request)
        field = request.query_params.get("field")
        if not field:
            raise BadVitalsQuery(400, "`field` is required: see /api/vitals/keys for each "
                                      "key's numeric fields")
        found = await reader.series(key, latest, window, field)
        return Response(chart_svg(_title(key, field, window), found.fields[field],
                                  found.failures, found.since, found.until), media_type=SVG)

    async def spark(request: Request) -> Response:
        key, latest = await reader.key(request)
        field = request.query_params.get("field") or None
        found = await reader.series(key, latest, DEFAULT_WINDOW, field, SPARK_POINTS_MAX)
        name = field or next(iter(found.fields), None)
        label = f"{key} · {name} — {WINDOW_TITLES[DEFAULT_WINDOW]}" if name else key
        return Response(spark_svg(label, found.fields.get(name) if name else None,
                                  found.failures, found.since, found.until), media_type=SVG)

    def answering(endpoint: Endpoint) -> Endpoint:
        async def answer(request: Request) -> Response:
            try:
                return await endpoint(request)
            except BadVitalsQuery as exc:
                return problem(exc.status, str(exc))
        return answer

    return [Route("/api/vitals/keys", answering(keys)),
            Route("/api/vitals", answering(series)),
            Route("/api/vitals/chart.svg", answering(chart)),
            Route("/api/vitals/spark.svg", answering(spark))]
