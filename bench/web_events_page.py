"""The Events page's first page over a large log, beside the raw indexed query.

    python -m bench.web_events_page [--events 1000000] [--repeats 1000] [--tmp DIR]

Builds a log of --events events through SqliteEventStore.append (4096-draft calls, as
bench.tick_scale does, its `tasks` mix: task and effect lifecycles among `tick` events) on
top of 1,000 oldest events, 100 of them `error` events (the rare kind: there are none among
the newer ones). With a writer holding the log open (so reads go through its -wal, as beside
a running engine), the store is opened read-only as the UI's process opens it, and the
view's query (`newest(store, parse_filter(...))`, pulse_adapters.web._query) is timed beside
plain sqlite3 on a connection of its own running the query that gives the same rows, one of
each per repetition, for: no filter, a kind filter, an origin filter and the rare kind (the
store reads kinds through events.db's (kind, seq) index, schema 2; the raw query runs on the
same file, so it has that index too). Floor: each of the four within 3x of raw.

Then an Engine with the web layer (the UI in its own process, port 0) serves the same log,
and the whole round trip GET /api/events?limit=100 (token, one keep-alive connection) is
timed beside the raw query.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    COLUMNS,
    Figure,
    Floor,
    Report,
    fmt,
    key_of,
    median,
    percentile,
    temp_dir,
    tick_payload,
)
from bench.tick_scale import build
from pulse_adapters.web import layer as web_layer
from pulse_adapters.web import read_token
from pulse_adapters.web._query import newest, parse_filter
from pulse_adapters.web._views import EVENT_PAGE_MAX
from pulse_core import Engine, EventDraft, LayerContext, SystemClock, error_draft
from pulse_core.store import SqliteEventStore, open_event_store

FLOOR_RATIO = 3.0
PAGE = 100
OLDEST = 1_000
RARE_KIND = "error"
RARE_EVERY = 10
KIND = "task-created"
ORIGIN = "executor:"
READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Query:
    """One Events-page query: its URL parameters and the raw SQL that gives the same rows."""

    name: str
    params: dict[str, list[str]]
    sql: str
    args: tuple[Any, ...] = ()
    floor: bool = False


PLAIN = Query("no filter", {}, f"SELECT {COLUMNS} FROM events ORDER BY seq DESC LIMIT {PAGE}",
              floor=True)
BY_KIND = Query(f"kind={KIND}", {"kind": [KIND]},
                f"SELECT {COLUMNS} FROM events WHERE kind = ? ORDER BY seq DESC LIMIT {PAGE}",
                (KIND,), floor=True)
BY_ORIGIN = Query(f"origin={ORIGIN}", {"origin": [ORIGIN]},
                  f"SELECT {COLUMNS} FROM events WHERE substr(origin, 1, {len(ORIGIN)}) = ? "
                  f"ORDER BY seq DESC LIMIT {PAGE}", (ORIGIN,), floor=True)
RARE = Query(f"kind={RARE_KIND} (only among the oldest {OLDEST:,})", {"kind": [RARE_KIND]},
             BY_KIND.sql, (RARE_KIND,), floor=True)
QUERIES = (PLAIN, BY_KIND, BY_ORIGIN, RARE)
PULSE_SQL = f"SELECT {COLUMNS} FROM events WHERE seq > ? AND kind IN (?) ORDER BY seq DESC " \
            "LIMIT ?"
"""What the store runs for a kind-filtered first page (pulse_core.store._sqlite_recorder)."""
PULSE_ORIGIN_SQL = f"SELECT {COLUMNS} FROM events WHERE seq > ? AND substr(origin, 1, ?) = ? " \
                   "ORDER BY seq DESC LIMIT ?"
"""What the store runs for an origin-filtered first page."""


@dataclass
class Timings:
    """Seconds per run of pulse's way (the view's query, or the HTTP round trip) and of the
    raw query, and the rows each gave."""

    pulse: list[float]
    raw: list[float]
    rows: int


async def build_log(path: Path, events: int) -> float:
    """The oldest OLDEST events (every RARE_EVERY-th of the rare kind), then the tasks mix;
    returns seconds."""
    started = time.perf_counter()
    store = await SqliteEventStore.open(path, synchronous="FULL")
    try:
        await store.append([
            error_draft("watcher:bench", RuntimeError(f"bench error {i}"))
            if i % RARE_EVERY == 0 else EventDraft("tick", key_of(i, 1000), tick_payload(i),
                                                   origin="engine")
            for i in range(OLDEST)])
    finally:
        await store.close()
    await build(path, events - OLDEST, "tasks")
    return time.perf_counter() - started


async def pairs(pulse: Callable[[], Awaitable[list[int]]], raw: Callable[[], list[int]],
                repeats: int, budget_s: float) -> Timings:
    """`repeats` runs of each, alternated (at least 3, at most `budget_s` seconds after the
    first one), after one warm-up run each that checks both give the same seqs."""
    got, expected = await pulse(), raw()
    if got != expected:
        raise RuntimeError(f"the view's query gave seqs {got[:5]}... ({len(got)}), raw "
                             f"sqlite3 {expected[:5]}... ({len(expected)})")
    out = Timings([], [], len(expected))
    deadline = time.perf_counter() + budget_s
    while len(out.pulse) < repeats and (len(out.pulse) < 3 or time.perf_counter() < deadline):
        started = time.perf_counter()
        await pulse()
        out.pulse.append(time.perf_counter() - started)
        started = time.perf_counter()
        raw()
        out.raw.append(time.perf_counter() - started)
    return out


def raw_query(conn: sqlite3.Connection, query: Query) -> Callable[[], list[int]]:
    def run() -> list[int]:
        return [row[0] for row in conn.execute(query.sql, query.args).fetchall()]
    return run


def plan(conn: sqlite3.Connection, sql: str, args: Sequence[Any]) -> str:
    """EXPLAIN QUERY PLAN of `sql`, its steps joined by '; '."""
    return "; ".join(str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args))


async def view_queries(path: Path, repeats: int, budget_s: float) -> dict[str, Timings]:
    """Each QUERIES entry through the view's query on a read-only store, beside raw."""
    writer = await SqliteEventStore.open(path)  # a live writer: reads go through its -wal
    await writer.append([EventDraft("tick", "bench-writer", {"n": 0}, origin="engine")])
    store = await open_event_store(f"sqlite://{path}", read_only=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        found: dict[str, Timings] = {}
        for query in QUERIES:
            f = parse_filter({**query.params, "limit": [str(PAGE)]}, EVENT_PAGE_MAX)

            async def pulse(f: Any = f) -> list[int]:
                return [e.seq for e in (await newest(store, f))[0]]

            found[query.name] = await pairs(pulse, raw_query(conn, query), repeats, budget_s)
        return found
    finally:
        conn.close()
        await store.close()
        await writer.close()


async def served(home: Path) -> str:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            return str(json.loads((home / "web.json").read_text())["url"])
        except (OSError, ValueError, KeyError):
            await asyncio.sleep(0.05)
    raise RuntimeError(f"the web UI did not serve within {READY_TIMEOUT_S:g} s")


async def through_ui(home: Path, repeats: int, budget_s: float) -> tuple[Timings, float]:
    """GET /api/events?limit=PAGE through an Engine's UI on one keep-alive connection,
    alternated with the raw query; and the seconds the engine took to open. The engine is
    idle meanwhile (its next tick an hour away)."""
    started = time.perf_counter()
    web = web_layer({"port": 0}, LayerContext(home, SystemClock()))
    async with Engine(home, layers=[web], default_tick_ms=3_600_000, builtin_rules=[]):
        opened = time.perf_counter() - started
        url = await served(home)
        conn = sqlite3.connect(home / "events.db", isolation_level=None)
        try:
            async with httpx.AsyncClient(headers={"authorization": f"Bearer {read_token(home)}"},
                                         timeout=60) as client:
                async def get() -> list[int]:
                    response = await client.get(url + "api/events", params={"limit": PAGE})
                    response.raise_for_status()
                    return [e["seq"] for e in response.json()["events"]]

                timings = await pairs(get, raw_query(conn, PLAIN), repeats, budget_s)
        finally:
            conn.close()
    return timings, opened


def runs(fn: Callable[[], list[int]], repeats: int, budget_s: float) -> list[float]:
    """Seconds per call of `fn`, `repeats` times (at least 3, at most `budget_s` seconds)."""
    fn()
    out: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(out) < repeats and (len(out) < 3 or time.perf_counter() < deadline):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def ms(values: Sequence[float]) -> float:
    return median(values) * 1000


@dataclass
class Results:
    """Everything one run measured."""

    build_s: float
    views: dict[str, Timings]
    http: Timings
    opened_s: float
    plans: dict[str, str]


def report_of(args: argparse.Namespace, r: Results) -> Report:
    report = Report(f"web_events_page: the Events page's first page ({PAGE} events) over "
                    f"{args.events:,} events, median of up to {args.repeats} each")
    for query in QUERIES:
        t = r.views[query.name]
        figure = Figure(f"events page, {query.name} p50", ms(t.pulse), "ms")
        limit = Figure(f"raw sqlite3 {_short(query.sql)} p50", ms(t.raw), "ms")
        ratio = figure.value / limit.value
        report.compare(figure, limit, ratio=ratio,
                       floor=Floor.ratio_at_most(ratio, FLOOR_RATIO) if query.floor else None)
    report.compare(Figure(f"GET /api/events?limit={PAGE} round trip p50", ms(r.http.pulse), "ms"),
                   Figure(f"raw sqlite3 {_short(PLAIN.sql)} p50", ms(r.http.raw), "ms"))
    report.note(f"log built in {fmt(r.build_s)} s ({fmt(args.events / r.build_s)} ev/s through "
                f"store.append); an Engine with the web layer opened on it in "
                f"{fmt(r.opened_s)} s")
    for query in QUERIES:
        t = r.views[query.name]
        report.note(f"{query.name} ({t.rows} rows, {len(t.pulse)} runs of each): p99 view "
                    f"{fmt(percentile(t.pulse, 99) * 1000)} ms, raw "
                    f"{fmt(percentile(t.raw, 99) * 1000)} ms")
    for what, text in r.plans.items():
        report.note(f"EXPLAIN QUERY PLAN {what} -> {text}")
    return report


def _short(sql: str) -> str:
    """The raw SQL with its column list elided."""
    return sql.replace(f"SELECT {COLUMNS} FROM events", "SELECT <columns>")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.web_events_page", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000,
                        help=f"events in the log (1,000,000; at least {2 * OLDEST:,})")
    parser.add_argument("--repeats", type=int, default=1000,
                        help="timed runs of each query and of its raw twin (1000)")
    parser.add_argument("--budget", type=float, default=10.0,
                        help="seconds at most per query once 3 runs are done (10)")
    parser.add_argument("--tmp", default=None, help="base directory for the home")
    args = parser.parse_args(argv)
    if args.events < 2 * OLDEST:
        parser.error(f"--events must be at least {2 * OLDEST:,}")
    return args


async def run(args: argparse.Namespace) -> Report:
    with temp_dir(args.tmp) as home:
        path = home / "events.db"
        build_s = await build_log(path, args.events)
        views = await view_queries(path, args.repeats, args.budget)
        http, opened_s = await through_ui(home, args.repeats, args.budget)
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            plans = {"of the store's kind-filtered page": plan(conn, PULSE_SQL, (0, KIND, PAGE)),
                     "of the store's origin-filtered page": plan(
                         conn, PULSE_ORIGIN_SQL, (0, len(ORIGIN), ORIGIN, PAGE))}
        finally:
            conn.close()
    return report_of(args, Results(build_s, views, http, opened_s, plans))


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
