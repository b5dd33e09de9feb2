"""The awareness reviewer in a fleet: engines on several hosts share one PostgreSQL log and a
Redis quiet hold. Each identity is reviewed by at most one engine at a time and each world
once, and a Redis outage leaves the reviews going (without the stored hold) and recorded."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis.asyncio

from pulse_adapters.awareness import AwarenessConfig, AwarenessReview, build_reviewer
from pulse_adapters.awareness.executor import ALREADY_REVIEWED
from pulse_adapters.awareness.fingerprint import fingerprint
from pulse_adapters.awareness.quiet import NAMESPACE, RESTORED, WHERE, QuietState
from pulse_adapters.llm.stand_in import ChatServer, QuietHTTPServer
from pulse_core import (
    Engine,
    Event,
    EventDraft,
    EventStore,
    LayerContext,
    ManualClock,
    MemoryBoard,
    identity_key,
)
from pulse_core._effects import effect_draft
from pulse_core._lease import owner_host
from pulse_core.memory import HumanExchange, IdentityRegistered
from pulse_core.store import PostgresURL, open_event_store, open_side_store, parse_store_url
from tests.adapters.awareness_rig import MINUTE, reply, settings
from tests.e2e.support import Child, fail_if_dead
from tests.fleet.fleet_support import ready, until
from tests.loopback import LOOPBACK, read_request
from tests.servers import PostgresServer, RedisServer
from tests.timing import scaled, until_progress

TEST_TIME_LIMIT_S = 900  # bounds a hang: the 10,000 reviews take 60 s alone, 150-300 s beside
# other tests, and their wait fails within REVIEWS_STALL_S once they stop moving
REVIEWS_STALL_S = 60
"""How long the fleet's reviews may make no progress at all before the test fails."""
REVIEWER_HOST = str(Path(__file__).resolve().parent / "reviewer_host.py")
IDENTITIES = 10_000
ENGINES = 4
CONCURRENCY = 32
"""Reviews each engine runs at once (the model answers in milliseconds: this bounds a burst)."""
_IDENTITY = re.compile(r'"identity":"([^"]+)"')


# -- a model server that records, per identity, when each call was in flight ------------------


class _BurstServer(QuietHTTPServer):
    """A threaded HTTP server whose listen queue takes a fleet's burst of new connections
    (socketserver's default of 5 refuses some of them)."""

    request_queue_size = 1_024
    daemon_threads = True


class ReviewModel:
    """A stand-in chat-completions server on 127.0.0.1 that answers every review "nothing
    new" after `delay_s`, and records per identity the interval (its own monotonic clock)
    during which each call was in flight. `healthy` False answers route probes (GET
    /v1/models, and completions that name no identity) with 503, so engines see their route
    unhealthy and review on the fallback cadence. With `go`, each review call waits for it
    to be set (the test says when the model answers)."""

    def __init__(self, *, delay_s: float = 0.0, healthy: bool = True,
                 go: threading.Event | None = None) -> None:
        self.delay_s = delay_s
        self.healthy = healthy
        self.go = go
        self.calls: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.in_flight = 0
        self._lock = threading.Lock()
        self._http: _BurstServer | None = None
        self._thread: threading.Thread | None = None
        text = json.dumps({"meaningful_change": False, "narration": "I see nothing new",
                           "verbs": []})
        chunks: list[dict[str, Any]] = [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                          "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                      "total_tokens": 2}},
        ]
        self._answer = b"".join(
            b"data: " + json.dumps({"id": "fleet", "object": "chat.completion.chunk",
                                    "created": 0, "model": "stand-in", **c}).encode() + b"\n\n"
            for c in chunks) + b"data: [DONE]\n\n"

    @property
    def base_url(self) -> str:
        """What the awareness layer takes as base_url."""
        assert self._http is not None
        return f"http://{LOOPBACK}:{self._http.server_address[1]}/v1"

    def __enter__(self) -> ReviewModel:
        self._http = _BurstServer((LOOPBACK, 0), self._handler())
        self._thread = threading.Thread(target=self._http.serve_forever,
                                        kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._http is not None and self._thread is not None
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(5)

    def total(self) -> int:
        """Calls answered so far."""
        with self._lock:
            return sum(len(spans) for spans in self.calls.values())

    def overlapping(self) -> list[str]:
        """Identities two of whose calls were in flight at the same time."""
        with self._lock:
            spans = {identity: sorted(s) for identity, s in self.calls.items()}
        return [identity for identity, s in spans.items()
                if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(s))]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers, then body: no delayed-ACK stall between

            def do_GET(self) -> None:
                if not owner.healthy:
                    self._send(503, "application/json", b'{"error": "unhealthy"}')
                    return
                self._send(200, "application/json",
                           b'{"object": "list", "data": [{"id": "stand-in"}]}')

            def do_POST(self) -> None:
                started = time.monotonic()
                body = read_request(self).json()
                found = _IDENTITY.search(" ".join(str(m.get("content")) for m in
                                                  body["messages"]))
                if found is None:  # a route probe
                    if owner.healthy:
                        self._send(200, "text/event-stream", owner._answer)
                    else:
                        self._send(503, "application/json", b'{"error": "unhealthy"}')
                    return
                identity = found.group(1)
                with owner._lock:
                    owner.in_flight += 1
                try:
                    if owner.delay_s:
                        time.sleep(owner.delay_s)
                    if owner.go is not None:
                        owner.go.wait(30)
                finally:  # counted before the answer goes: a caller never outruns its count
                    with owner._lock:
                        owner.in_flight -= 1
                        owner.calls[identity].append((started, time.monotonic()))
                self._send(200, "text/event-stream", owner._answer)

            def _send(self, status: int, kind: str, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


# -- helpers ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def reviewing_engine(home: Path, model: ReviewModel, store: str, host: str,
                           clock: ManualClock, **options: Any) -> AsyncIterator[Engine]:
    """An engine of `host` on the shared log `store` whose awareness layer asks `model`:
    opened (not started), and closed with its model client afterwards."""
    reviewer = build_reviewer(layer_settings(model.base_url, AwarenessConfig(initial_delay_s=30)),
                              LayerContext(home, clock))
    engine = Engine(home, store=store, clock=clock, layers=[reviewer.layer], host=host,
                    **options)
    await engine.open()
    try:
        yield engine
    finally:
        await engine.close()
        await reviewer.client.aclose()


def identity_name(index: int) -> str:
    return f"id-{index:05d}"


async def seed(store: EventStore, count: int) -> None:
    """`count` identities, each registered with one human exchange: each is due for review."""
    drafts: list[EventDraft] = []
    for index in range(count):
        key = identity_key(identity_name(index))
        drafts += [
            EventDraft("identity-registered", key,
                       msgspec.to_builtins(IdentityRegistered(f"person {index}"))),
            EventDraft("human-exchange", key, msgspec.to_builtins(HumanExchange(
                record=f"x-{index:05d}", text="see you tomorrow")), origin="human"),
        ]
    for start in range(0, len(drafts), 2_000):
        await store.append(drafts[start:start + 2_000])


@pytest.fixture
async def redis_db(redis_server: RedisServer) -> AsyncIterator[str]:
    """The URL of an emptied database of its own (15) in the session's redis-server."""
    raw = redis.asyncio.Redis(host=LOOPBACK, port=redis_server.port, db=15)
    try:
        await raw.flushdb()
        yield redis_server.url(15)
    finally:
        await raw.aclose()


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    """A scripted chat-completions server on 127.0.0.1, stopped after the test."""
    with ChatServer() as server:
        yield server


def layer_settings(base_url: str, review: AwarenessConfig) -> dict[str, Any]:
    """The awareness layer's object in config.json, for the model at `base_url`."""
    return {"base_url": base_url, "model": "stand-in", "timeout_s": 30, "max_wall_s": 30,
            "route_ttl_s": 3600, "review": msgspec.to_builtins(review)}


async def stored_holds(url: str) -> dict[str, QuietState]:
    side = await open_side_store(url, read_only=True)
    try:
        return {k: msgspec.json.decode(v, type=QuietState)
                for k, v in (await side.get_all(NAMESPACE)).items()}
    finally:
        await side.close()


# -- each world reviewed once, by one engine at a time ----------------------------------------


async def test_a_world_another_engine_is_reviewing_is_waited_for_and_not_asked_again(
    tmp_path: Path, pg_url: str,
) -> None:
    clock = ManualClock()
    with ReviewModel(delay_s=0.5) as model:
        async with reviewing_engine(tmp_path / "a", model, pg_url, "host-a", clock,
                                    executor_concurrency=1) as a, \
                reviewing_engine(tmp_path / "b", model, pg_url, "host-b", clock) as b:
            board = MemoryBoard(a.events)
            await board.register("ana", "Ana")
            asked = await board.exchange("ana", "I'll stay in Lisbon")
            memory = (await a.snapshot()).projection("memory")["ana"]
            effect = AwarenessReview(identity="ana", fingerprint=fingerprint(memory),
                                     source=asked.data["record"], reason="changed",
                                     route="dedicated")
            for _ in range(2):  # two engines decided the same review at the same moment
                await a.events.append([effect_draft(effect, origin="rule:awareness")])
            running = asyncio.create_task(a.executor_loop.run_until_idle())

            async def asked_once() -> bool:
                return model.in_flight == 1

            await until(asked_once, 10, "engine a asks the model")
            await b.executor_loop.run_until_idle()  # claims the other effect: waits for a
            await running
            log = await a.events.read()
    assert model.total() == 1 and model.overlapping() == []
    (cycle,) = [e for e in log if e.kind == "awareness-cycle"]
    assert cycle.data["outcome"] == "reviewed" and cycle.data["model_calls"] == 1
    claims = {e.key: e for e in log if e.kind == "effect-executing"}
    acks = {e.key: e for e in log if e.kind == "effect-acked"}
    outcomes = {owner_host(claims[k].data["owner"]): a.data["result"]["outcome"]
                for k, a in acks.items()}
    assert sorted(outcomes.values()) == [ALREADY_REVIEWED, "reviewed"]
    late = next(k for k, a in acks.items() if a.data["result"]["outcome"] == ALREADY_REVIEWED)
    assert claims[late].seq < cycle.seq  # claimed while the other review was in flight
    assert acks[late].data["result"]["cycle"] == cycle.seq


# -- the lock's connection lost during a review ----------------------------------------------

KILL_THE_LOCK_AT_SETTLEMENT = """
CREATE FUNCTION pulse.kill_lock_holder() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_terminate_backend(pid) FROM pg_locks
        WHERE locktype = 'advisory' AND pid <> pg_backend_pid();
    RETURN NULL;
END $$;
CREATE TRIGGER kill_lock_holder AFTER INSERT ON pulse.events FOR EACH ROW
    WHEN (NEW.kind = 'awareness-cycle') EXECUTE FUNCTION pulse.kill_lock_holder();
"""
"""Terminates the session holding the review's lock inside the settlement's own transaction:
the settlement commits, then the review leaves a lock that is gone."""


def database(url: str) -> str:
    parsed = parse_store_url(url)
    assert isinstance(parsed, PostgresURL)
    return parsed.database


async def ask_review(engine: Engine) -> None:
    """Ana's first exchange, and a review of it asked for."""
    board = MemoryBoard(engine.events)
    await board.register("ana", "Ana")
    asked = await board.exchange("ana", "I'll stay in Lisbon")
    memory = (await engine.snapshot()).projection("memory")["ana"]
    effect = AwarenessReview(identity="ana", fingerprint=fingerprint(memory),
                             source=asked.data["record"], reason="changed", route="dedicated")
    await engine.events.append([effect_draft(effect, origin="rule:awareness")])


async def test_a_lock_lost_after_the_settlement_committed_leaves_the_review_acked_and_reported(
    tmp_path: Path, pg_url: str, postgres_server: PostgresServer,
) -> None:
    with ReviewModel() as model:
        async with reviewing_engine(tmp_path / "a", model, pg_url, "host-a",
                                    ManualClock()) as engine:
            await ask_review(engine)
            postgres_server.sql(KILL_THE_LOCK_AT_SETTLEMENT, database(pg_url))
            await engine.executor_loop.run_until_idle()
            log = await engine.events.read()
    assert model.total() == 1
    (cycle,) = [e for e in log if e.kind == "awareness-cycle"]
    assert cycle.data["outcome"] == "reviewed"
    assert [e.kind for e in log if e.kind.startswith("effect-") and e.kind != "effect-executing"
            ] == ["effect-acked"]
    (ack,) = [e for e in log if e.kind == "effect-acked"]
    assert ack.data["result"]["outcome"] == "reviewed"
    assert "'awareness:ana' was lost while held" in ack.data["result"]["lock_lost"]
    (error,) = [e for e in log if e.kind == "error"]
    assert error.key == "executor:awareness" and error.data["type"] == "LockLost"
    assert error.data["effect"] == ack.key and error.seq > cycle.seq


async def test_a_review_whose_lock_was_lost_during_the_model_call_settles_nothing(
    tmp_path: Path, pg_url: str, postgres_server: PostgresServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    go = threading.Event()
    with ReviewModel(go=go) as model, caplog.at_level(logging.WARNING, "pulse"):
        async with reviewing_engine(tmp_path / "a", model, pg_url, "host-a",
                                    ManualClock()) as engine:
            try:
                await ask_review(engine)
                reviewing = asyncio.create_task(engine.executor_loop.run_until_idle())

                async def asked() -> bool:
                    return model.in_flight == 1

                await until(asked, 10, "the review asks the model")
                killed = postgres_server.sql(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = "
                    "'advisory'", database(pg_url))
                go.set()
                await reviewing
                after_loss = await engine.events.read()
                await ask_review(engine)  # the rule asks again: the lock is taken afresh
                await engine.executor_loop.run_until_idle()
                log = await engine.events.read()
            finally:  # the model answers: closing drains no waiting call
                go.set()
    assert killed == "1"
    assert [e for e in after_loss if e.kind == "awareness-cycle"] == []
    (failed,) = [e for e in after_loss if e.kind == "effect-failed"]
    assert "'awareness:ana' was lost while held" in failed.data["error"]
    # refused at once, not sent again as through an outage (a lost lock does not come back)
    assert [r.getMessage() for r in caplog.records if "cannot take it yet" in r.getMessage()
            ] == []
    assert model.total() == 2
    (cycle,) = [e for e in log if e.kind == "awareness-cycle"]
    assert cycle.data["outcome"] == "reviewed"


# -- the fleet: four engine processes, one log, one Redis quiet hold -------------------------


def fleet_config(home: Path, number: int, store: str, side_store: str,
                 model: ReviewModel) -> None:
    """config.json of engine `number`: the shared log and side store, a host of its own,
    and the awareness layer on the fallback cadence (the model refuses route probes, so the
    route is never healthy): each quiet world is checked and held from 30 s after its review
    (the floor), every few seconds."""
    review = AwarenessConfig(initial_delay_s=0.001, fallback_interval_s=2, quiet_hold_s=3,
                             max_reviews_per_tick=100, calls_per_day=1_000_000)
    home.mkdir(mode=0o700, parents=True)
    config = {
        "instance": f"fleet-{number}", "default_tick_ms": 1_000, "store": store,
        "side_store": side_store, "host": f"fleet-host-{number}",
        "layers": {"awareness": layer_settings(model.base_url, review)},
    }
    (home / "config.json").write_text(json.dumps(config))


@contextlib.contextmanager
def reviewer_hosts() -> Iterator[list[Child]]:
    """A list to start reviewer host processes into; every one still running at the end is
    killed."""
    hosts: list[Child] = []
    try:
        yield hosts
    finally:
        for host in hosts:
            host.close()


class Progress:
    """What the fleet has written so far, read from the log as it grows."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.after = 0
        self.cycles: list[Event] = []
        self.effects: dict[str, Event] = {}
        self.claims: dict[str, list[Event]] = defaultdict(list)
        self.finished: dict[str, Event] = {}

    async def read(self) -> None:
        for event in await self.store.read(self.after, kinds=[
                "awareness-cycle", "effect", "effect-executing", "effect-acked",
                "effect-failed"]):
            self.after = event.seq
            if event.kind == "awareness-cycle":
                self.cycles.append(event)
            elif event.kind == "effect":
                if event.data["effect"]["type"] == "awareness-review":
                    self.effects[event.key] = event
            elif event.key not in self.effects:
                continue  # another layer's effect
            elif event.kind == "effect-executing":
                self.claims[event.key].append(event)
            else:
                self.finished[event.key] = event


async def test_ten_thousand_identities_reviewed_by_four_engines_each_once_never_two_at_a_time(
    tmp_path: Path, pg_url: str, redis_db: str,
) -> None:
    store = await open_event_store(pg_url)
    started = time.monotonic()
    try:
        await seed(store, IDENTITIES)
        with ReviewModel(delay_s=0.002, healthy=False) as model, reviewer_hosts() as hosts:
            for number in range(ENGINES):
                home = tmp_path / f"engine-{number}"
                fleet_config(home, number, pg_url, redis_db, model)
                hosts.append(Child(REVIEWER_HOST, [
                    str(home), "--concurrency", str(CONCURRENCY),
                    "--max-seconds", str(scaled(TEST_TIME_LIMIT_S) + 60)], tmp_path))
            await ready(*hosts)
            progress = Progress(store)

            async def all_reviewed() -> bool:
                await progress.read()
                return len(progress.cycles) >= IDENTITIES and \
                    len(progress.finished) == len(progress.effects)

            def moved() -> tuple[int, int, int]:
                return len(progress.cycles), len(progress.effects), len(progress.finished)

            await until_progress(all_reviewed, moved, REVIEWS_STALL_S,
                                 f"{IDENTITIES} identities reviewed",
                                 check=lambda: fail_if_dead("reviews", hosts))
            reviewed_in = time.monotonic() - started

            async def held() -> bool:  # checked no sooner than 30 s after its review
                return len(await stored_holds(redis_db)) > 0

            await until(held, 90, "a quiet world checked and held in Redis", *hosts)
            holds = await stored_holds(redis_db)
            codes = [host.stop(30) for host in hosts]  # each closes its engine cleanly
            await progress.read()
    finally:
        await store.close()
    print(f"\nfleet: {IDENTITIES} identities, {ENGINES} engines: reviewed in "
          f"{reviewed_in:.1f} s; {len(progress.effects)} review effects, "
          f"{model.total()} model calls, {len(holds)} quiet holds in Redis")
    assert codes == [0] * ENGINES
    # the single-engine floor: each identity's world, new and unchanged since, is worth
    # exactly one call (a second needs news or the quiet ceiling, an hour away)
    assert model.total() == IDENTITIES
    assert sorted(model.calls) == [identity_name(i) for i in range(IDENTITIES)]
    assert model.overlapping() == []
    assert Counter(c.data["outcome"] for c in progress.cycles) == {"reviewed": IDENTITIES}
    assert sum(c.data["model_calls"] for c in progress.cycles) == IDENTITIES
    outcomes = Counter(a.data.get("result", {}).get("outcome")
                       for a in progress.finished.values())
    assert outcomes == {"reviewed": IDENTITIES,
                        ALREADY_REVIEWED: len(progress.effects) - IDENTITIES}
    assert all(len(claims) == 1 for claims in progress.claims.values())
    hosts_claiming = Counter(owner_host(claims[0].data["owner"])
                             for claims in progress.claims.values())
    assert len(hosts_claiming) == ENGINES  # every engine took part
    assert all(h.skips >= 1 and h.hold_until > h.last_check_at for h in holds.values())


# -- the quiet hold in Redis, through an outage ---------------------------------------------


async def test_reviews_go_on_without_the_hold_while_redis_is_down_and_the_outage_is_recorded(
    tmp_path: Path, chat_server: ChatServer, redis_db: str, restore_redis: RedisServer,
) -> None:
    clock = ManualClock()
    home = tmp_path / "home"
    reviewer = build_reviewer(settings(chat_server, AwarenessConfig(quiet_hold_s=120)),
                              LayerContext(home, clock))
    engine = Engine(home, clock=clock, layers=[reviewer.layer], side_store=redis_db)
    await engine.open()
    keeper = reviewer.layer.services[0]  # the QuietHoldKeeper (then the ForegroundFollower)
    service = asyncio.ensure_future(keeper(engine))
    await asyncio.sleep(0)  # the service binds the quiet hold to the engine's side store

    async def tick(minutes: float) -> list[Event]:
        await engine.vitals.record("llm-route", {"ok": True})
        clock.advance(int(minutes * MINUTE))
        before = await engine.events.last_seq()
        await engine.tick()
        await engine.executor_loop.run_until_idle()
        return await engine.events.read(before, kinds=["awareness-cycle"])

    try:
        board = MemoryBoard(engine.events)
        for name in ("ana", "bo"):
            await board.register(name)
            await board.exchange(name, "see you tomorrow")
        chat_server.script(reply(), reply())
        assert len(await tick(1)) == 2
        assert await tick(1.5) == []  # both quiet: held, written behind to Redis
        await reviewer.quiet.drain()
        assert set(await stored_holds(redis_db)) == {"ana", "bo"}

        restore_redis.kill()
        await board.exchange("bo", "I'm moving to Porto")
        chat_server.script(reply(change=True, narration="I noticed bo is moving"))
        (during,) = await tick(1)  # the news is reviewed, the hold cannot be written
        assert during.data["identity"] == "bo" and during.data["outcome"] == "reviewed"
        for _ in range(4):
            assert await tick(1) == []  # ana stays held in memory: no model call
        assert reviewer.quiet.failures >= 2
        await reviewer.quiet.drain()
        errors = await engine.events.read(kinds=["error"])
        assert [(e.key, e.data["type"]) for e in errors] == [(WHERE, "QuietHoldUnavailable")]
        assert f"redis://127.0.0.1:{restore_redis.port}" in errors[0].data["message"]
        assert await engine.events.read(kinds=[RESTORED]) == []

        restore_redis.start()  # back, and empty: it keeps nothing across a restart
        assert await tick(0.5) == []
        await reviewer.quiet.drain()
        await tick(0)  # the hold read again comes in; every hold is written back
        await reviewer.quiet.drain()
        (restored,) = await engine.events.read(kinds=[RESTORED])
        assert restored.key == WHERE and restored.data["failures"] == reviewer.quiet.failures
        assert await stored_holds(redis_db) == {
            name: reviewer.quiet.get(name) for name in ("ana", "bo")}
        assert len(await engine.events.read(kinds=["error"])) == 1  # one outage, one error
    finally:
        service.cancel()
        await asyncio.gather(service, return_exceptions=True)
        await engine.close()
        await reviewer.client.aclose()
