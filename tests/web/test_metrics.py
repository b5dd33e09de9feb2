"""/metrics: the exposition parses with the Prometheus client's own parser and its numbers
match the log (folded here independently), the engine's instruments and its vitals; `upulse
metrics` prints it from a home's log without a daemon, or from the web service that serves."""

from __future__ import annotations

import asyncio
import collections
import json
import os
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pulse_adapters.awareness import AwarenessConfig, build_reviewer
from pulse_adapters.llm.stand_in import ChatServer
from pulse_adapters.web import configured_metrics, ensure_token
from pulse_adapters.web._metrics import (
    EngineMetrics,
    LayerTally,
    LogTally,
    log_exposition,
    vital_fields,
)
from pulse_core import (
    Backoff,
    Decision,
    Effect,
    Engine,
    Event,
    EventStore,
    ExecutionContext,
    Executor,
    Inner,
    LayerContext,
    ManualClock,
    MemoryBoard,
    PulseError,
    Snapshot,
    Watcher,
    fold_effect,
    open_home,
)
from pulse_core._effects import effect_draft, mark_draft
from pulse_survival import GaveUp, RestartProcess, survival_metrics
from tests.adapters.awareness_rig import MINUTE, close_engine, open_engine, reply, settings
from tests.cli.runner import Upulse
from tests.loopback import LoopbackServer

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(exposition: bytes) -> Samples:
    """Every sample of the exposition by name and labels, through the client's own parser."""
    found: Samples = {}
    for family in text_string_to_metric_families(exposition.decode()):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def series(found: Samples, name: str, label: str) -> dict[str, float]:
    """The samples called `name`, by their value of `label`."""
    return {dict(labels)[label]: value for (n, labels), value in found.items() if n == name}


def value(found: Samples, name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


class Ok(Effect, tag="metrics-ok"):
    n: int


class Bad(Effect, tag="metrics-bad"):
    n: int


class Stray(Effect, tag="metrics-stray"):
    """No executor handles it: its one attempt fails for good."""


class Works(Executor):
    handles = (Ok,)

    async def execute(self, effect: Ok, ctx: ExecutionContext) -> dict[str, int]:
        return {"n": effect.n}


class Breaks(Executor):
    handles = (Bad,)
    max_attempts = 2
    backoff = Backoff(initial_ms=1_000, factor=2.0, max_ms=10_000, jitter=0.0)

    async def execute(self, effect: Bad, ctx: ExecutionContext) -> None:
        raise ConnectionError("down")


class Gauges(Watcher):
    name = "gauges"
    interval = 60.0

    async def collect(self) -> dict[str, Any]:
        return {"load": 1.5, "up": True, "label": "text", "disk": {"/": 40, "/home": 55.5},
                "list": [1, 2]}


class Failing(Watcher):
    name = "failing"
    interval = 60.0

    async def collect(self) -> dict[str, Any]:
        raise OSError("sensor gone")


async def first_tick_emits(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    effects, tick_ms = await inner(prev, curr)
    if curr.number == 1:
        effects = [*effects, Ok(n=1), Ok(n=2), Bad(n=1), Stray()]
    return Decision(effects, tick_ms)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[tuple[Engine, ManualClock]]:
    clock = ManualClock()
    engine = Engine(tmp_path / "home", rules=[first_tick_emits], executors=[Works(), Breaks()],
                    watchers=[Gauges(), Failing()], clock=clock)
    await engine.open()
    try:
        yield engine, clock
    finally:
        await engine.close()


async def run(engine: Engine, clock: ManualClock) -> None:
    """Tick 1 decides the effects; Ok acks, Stray fails for good, Bad fails, then fails for
    good 0.5 s after its retry came due; one more Ok is left pending."""
    await engine.tick()
    await engine.executor_loop.run_until_idle()
    clock.advance(1_500)
    await engine.tick()
    await engine.executor_loop.run_until_idle()
    await engine.append([effect_draft(Ok(n=3), "agent")])


async def effects_in_log(events: EventStore) -> collections.Counter[tuple[str, str]]:
    """Every effect's state and type, folded here from the whole log."""
    entries: dict[str, Any] = {}
    for event in await events.read():
        if event.kind == "effect" or event.key in entries:
            entries[event.key] = fold_effect(entries.get(event.key), event)
    return collections.Counter((str(e.status), e.tag) for e in entries.values())


def attempts_in_log(events: list[Event]) -> collections.Counter[tuple[str, str]]:
    """Each attempt's effect type and outcome, as the log records them."""
    tags = {e.key: e.data["effect"]["type"] for e in events if e.kind == "effect"}
    found: collections.Counter[tuple[str, str]] = collections.Counter()
    for e in events:
        if e.kind == "effect-acked":
            found[(tags[e.key], "acked")] += 1
        elif e.kind == "effect-failed":
            found[(tags[e.key], "failed" if e.data["final"] else "retry")] += 1
    return found


async def test_effects_by_state_and_tag_match_the_log(engine: Any) -> None:
    live, clock = engine
    metrics = EngineMetrics(live)
    await run(live, clock)
    found = parse(await metrics.exposition())
    expected = await effects_in_log(live.events)
    assert {("pending", "metrics-ok"), ("acked", "metrics-ok"), ("failed", "metrics-bad"),
            ("failed", "metrics-stray")} <= set(expected)
    shown = {(dict(labels)["state"], dict(labels)["tag"]): v
             for (name, labels), v in found.items() if name == "pulse_effects"}
    # a state an effect has passed through stays a series, at 0
    assert {key: v for key, v in shown.items() if v} == {
        key: float(count) for key, count in expected.items()}
    assert shown[("executing", "metrics-ok")] == 0


async def test_a_scrape_folds_only_what_was_appended_since_the_last(engine: Any) -> None:
    live, clock = engine
    metrics = EngineMetrics(live)
    await run(live, clock)
    await metrics.exposition()
    assert metrics.log.seq == await live.events.last_seq()
    await live.append([effect_draft(Ok(n=4), "agent"), effect_draft(Ok(n=5), "agent")])
    await live.executor_loop.run_until_idle()
    found = parse(await metrics.exposition())  # counted once each, not again
    expected = await effects_in_log(live.events)
    assert value(found, "pulse_effects", state="acked", tag="metrics-ok") == \
        expected[("acked", "metrics-ok")] == 5
    assert value(found, "pulse_store_last_seq") == await live.events.last_seq()


async def test_the_instruments_families_match_the_attempts_in_the_log(engine: Any) -> None:
    live, clock = engine
    metrics = EngineMetrics(live)
    metrics.attach()
    await run(live, clock)
    found = parse(await metrics.exposition())
    events = await live.events.read()
    assert value(found, "pulse_ticks_total") == 2
    assert value(found, "pulse_tick_duration_seconds_count") == 2
    claims = collections.Counter(e.data["effect"]["type"] for e in events if e.kind == "effect"
                                 for c in events if c.kind == "effect-executing"
                                 and c.key == e.key)
    assert series(found, "pulse_effect_dispatch_latency_seconds_count", "tag") == {
        tag: float(n) for tag, n in claims.items()}
    # Bad's retry came due 1 s after its failure and was claimed 1.5 s after it
    assert value(found, "pulse_effect_dispatch_latency_seconds_sum", tag="metrics-bad") == 0.5
    attempts = {(dict(labels)["tag"], dict(labels)["outcome"]): v
                for (name, labels), v in found.items()
                if name == "pulse_executor_duration_seconds_count"}
    assert attempts == {key: float(n) for key, n in attempts_in_log(events).items()}
    metrics.close()
    clock.advance(5_000)
    await live.tick()
    assert value(parse(await metrics.exposition()), "pulse_ticks_total") == 2  # detached


async def test_vitals_are_gauges_of_each_watchers_latest_sample(engine: Any) -> None:
    live, _ = engine
    metrics = EngineMetrics(live)
    await live.sample()
    found = parse(await metrics.exposition())
    gauges = {dict(labels)["field"]: v for (name, labels), v in found.items()
              if name == "pulse_vital" and dict(labels)["key"] == "gauges"}
    assert gauges == {"load": 1.5, "up": 1.0, "disk./": 40.0, "disk./home": 55.5}
    assert value(found, "pulse_vital_ok", key="gauges") == 1.0
    assert value(found, "pulse_vital_ok", key="failing") == 0.0
    assert not [labels for (name, labels) in found
                if name == "pulse_vital" and ("key", "failing") in labels]
    latest = await live.vitals.latest(["gauges"])
    assert value(found, "pulse_vital_timestamp_seconds", key="gauges") == \
        latest["gauges"].ts / 1000


def test_vital_fields_are_bounded_and_skip_what_is_not_a_number() -> None:
    assert vital_fields(3) == [("value", 3.0)]
    assert vital_fields({"a": float("nan"), "b": 10**400, "c": None, "d": "7"}) == []
    assert vital_fields({"a": {"b": {"c": 1, "d": {"too": 2}}}}) == [("a.b.c", 1.0)]
    assert len(vital_fields({str(i): i for i in range(1000)})) == 64


async def test_attach_needs_the_engine_itself(engine: Any) -> None:
    live, _ = engine

    class View:
        events, vitals = live.events, live.vitals
        watchers: tuple[Any, ...] = ()

    with pytest.raises(PulseError, match="needs the Engine itself"):
        EngineMetrics(View()).attach()


async def survival_history(home: Path) -> None:
    """Restarts and give-ups as the survival layer records them, appended to `home`'s log."""
    stores = await open_home(home)
    try:
        def restart(name: str) -> Any:
            return effect_draft(RestartProcess(name=name, argv=("true",)), "engine:tick")

        await stores.events.append([restart("gateway"), restart("gateway"), restart("db")])
        await stores.events.append([mark_draft(GaveUp(name="gateway", why="5 failed starts"),
                                               "engine:tick")])
    finally:
        await stores.close()


async def restarts_in_log(events: EventStore) -> tuple[dict[str, int], dict[str, int]]:
    restarts = collections.Counter(e.data["effect"]["name"] for e in await events.read(
        kinds=["effect"]) if e.data["effect"]["type"] == "restart-process")
    give_ups = collections.Counter(e.data["mark"]["name"] for e in await events.read(
        kinds=["mark"]) if e.data["mark"]["type"] == "process-gave-up")
    return dict(restarts), dict(give_ups)


async def test_restarts_and_give_ups_per_process_match_the_log(tmp_path: Path) -> None:
    home = tmp_path / "home"
    await survival_history(home)
    stores = await open_home(home, read_only=True)
    try:
        found = parse(await log_exposition(stores, configured_metrics(home)))
        restarts, give_ups = await restarts_in_log(stores.events)
        last_seq = await stores.events.last_seq()
    finally:
        await stores.close()
    assert restarts == {"gateway": 2, "db": 1} and give_ups == {"gateway": 1}
    assert series(found, "pulse_process_restarts_total", "process") == restarts
    assert series(found, "pulse_process_give_ups_total", "process") == give_ups
    assert value(found, "pulse_store_last_seq") == last_seq
    assert value(found, "pulse_store_file_bytes", file="events.db") == \
        (home / "events.db").stat().st_size
    assert not [name for name, _ in found if name.startswith(("pulse_ticks", "pulse_vital"))]


async def test_each_catch_up_counts_only_the_events_appended_since_the_last(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    await survival_history(home)
    stores = await open_home(home)
    try:
        tally = LogTally(stores.events)
        await tally.catch_up()
        assert tally.seq == await stores.events.last_seq()
        layers = LayerTally(stores.events, survival_metrics())
        await layers.families()
        await stores.events.append([effect_draft(
            RestartProcess(name="db", argv=("true",)), "engine:tick")])
        await tally.catch_up()
        assert tally.seq == await stores.events.last_seq()
        restarts, give_ups = await layers.families()
        assert {s.labels["process"]: s.value for s in restarts.samples} == \
            (await restarts_in_log(stores.events))[0] == {"gateway": 2, "db": 2}
        assert {s.labels["process"]: s.value for s in give_ups.samples} == {"gateway": 1}
    finally:
        await stores.close()


async def test_reviewer_cycles_calls_and_verbs_match_its_cycle_records(tmp_path: Path) -> None:
    clock = ManualClock()
    home = tmp_path / "home"
    with ChatServer() as server:
        reviewer = build_reviewer(settings(server, AwarenessConfig(initial_delay_s=30)),
                                  LayerContext(home, clock))
        live, service = await open_engine(home, clock, reviewer)
        try:
            await live.vitals.record("llm-route", {"ok": True})
            board = MemoryBoard(live.events)
            await board.register("ana", "Ana")
            await board.set_state("ana", "city", "Lisbon", confidence=0.6)
            await board.exchange("ana", "I think I'll stay in Lisbon for good")
            server.script(reply(change=True, narration="I noticed Ana settling in", verbs=[
                {"verb": "adjust_confidence", "target": "state:city", "delta": 0.2},
                {"verb": "create_goal", "target": "state:goal", "value": "obey"}]))
            clock.advance(MINUTE)
            await live.tick()
            await live.executor_loop.run_until_idle()
            found = parse(await EngineMetrics(live).exposition())
            (cycle,) = await live.events.read(kinds=["awareness-cycle"])
        finally:
            await close_engine(live, service)
            await reviewer.client.aclose()
    record = cycle.data
    assert len(record["accepted"]) == 1 and len(record["rejected"]) == 1
    assert series(found, "pulse_reviewer_cycles_total", "outcome") == {record["outcome"]: 1}
    assert value(found, "pulse_reviewer_model_calls_total") == record["model_calls"] == 1
    assert series(found, "pulse_reviewer_verbs_accepted_total", "verb") == {
        "adjust_confidence": 1}
    assert value(found, "pulse_reviewer_verbs_rejected_total") == 1


def test_upulse_metrics_reads_the_log_of_a_home_without_a_daemon(tmp_path: Path) -> None:
    upulse = Upulse(tmp_path)
    home = upulse.init(tmp_path / "home")
    asyncio.run(survival_history(home))
    done = upulse("metrics", "--home", home)
    found = parse(done.stdout.encode())
    assert series(found, "pulse_process_restarts_total", "process") == {"gateway": 2, "db": 1}
    assert series(found, "pulse_process_give_ups_total", "process") == {"gateway": 1}
    assert value(found, "pulse_store_last_seq") >= 2
    assert done.stderr == ""


class _Served(BaseHTTPRequestHandler):
    """A stand-in for the daemon's web service: /metrics with the right bearer token."""

    token = ""
    body = b""

    def do_GET(self) -> None:
        ok = self.path == "/metrics" and \
            self.headers.get("Authorization") == f"Bearer {self.token}"
        payload = self.body if ok else b"refused"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def serve_address(home: Path, url: str) -> None:
    """HOME/web.json as the web service writes it while it serves (this process as its pid)."""
    (home / "web.json").write_text(json.dumps({"url": url, "pid": os.getpid()}))


def test_upulse_metrics_prints_the_served_metrics_with_the_homes_token(
    tmp_path: Path,
) -> None:
    upulse = Upulse(tmp_path)
    home = upulse.init(tmp_path / "home")
    _Served.token = ensure_token(home)
    _Served.body = b"# TYPE pulse_ticks counter\npulse_ticks_total 42.0\n"
    server = LoopbackServer()
    server.serve(_Served)
    try:
        serve_address(home, f"http://127.0.0.1:{server.port}/")
        done = upulse("metrics", "--home", home)
    finally:
        server.shutdown()
    assert done.stdout == _Served.body.decode()


def test_upulse_metrics_reads_the_log_when_the_served_address_does_not_answer(
    tmp_path: Path,
) -> None:
    upulse = Upulse(tmp_path)
    home = upulse.init(tmp_path / "home")
    ensure_token(home)
    asyncio.run(survival_history(home))
    server = LoopbackServer()
    server.serve(_Served)
    port = server.port
    server.shutdown()  # the port is closed now
    serve_address(home, f"http://127.0.0.1:{port}/")
    done = upulse("metrics", "--home", home)
    assert f"the web service at http://127.0.0.1:{port}/ did not answer" in done.stderr
    found = parse(done.stdout.encode())
    assert series(found, "pulse_process_restarts_total", "process") == {"gateway": 2, "db": 1}
