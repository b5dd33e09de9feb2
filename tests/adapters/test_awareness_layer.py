"""The `awareness` layer: built from config.json's settings or from Python, its API key from
the environment, its quiet hold in the home's side store (state.db) across restarts and
through side-store failures."""

from __future__ import annotations

import asyncio
import inspect
import json
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

import pulse_adapters.awareness
from pulse_adapters.awareness import (
    AwarenessConfig,
    AwarenessReview,
    AwarenessSettings,
    AwarenessSettingsError,
    InvalidEnvelope,
    QuietHold,
    QuietState,
    build_reviewer,
    layer,
)
from pulse_adapters.awareness.quiet import NAMESPACE, WHERE
from pulse_adapters.llm.stand_in import ChatServer, Stream
from pulse_core import (
    Engine,
    Event,
    HomeLayout,
    LayerContext,
    LayerError,
    ManualClock,
    MemoryBoard,
    PulseError,
    SqliteSideStore,
    SystemClock,
    available_layers,
    load_layer,
    load_layers,
)
from tests.adapters.awareness_rig import MINUTE, close_engine, open_engine, reply, settings

KEY_VARIABLE = "PULSE_TEST_AWARENESS_KEY"


async def eventually(check: Callable[[], Awaitable[bool]], limit_s: float = 20.0) -> None:
    """Wait until `check()` holds (an outcome, not a speed: `limit_s` only ends a hang)."""
    async with asyncio.timeout(limit_s):
        while not await check():  # noqa: ASYNC110 - the engine and the server run on their own
            await asyncio.sleep(0.02)


async def stored_holds(home: Path, clock: ManualClock) -> dict[str, QuietState]:
    """The quiet hold as state.db holds it at `clock`'s now (each value expires), read
    through a read-only side store."""
    side = await SqliteSideStore.open(HomeLayout.at(home).side_db, clock=clock, read_only=True)
    try:
        return {k: msgspec.json.decode(v, type=QuietState)
                for k, v in (await side.get_all(NAMESPACE)).items()}
    finally:
        await side.close()


async def seed(board: MemoryBoard) -> None:
    await board.register("ana", "Ana")
    await board.set_state("ana", "city", "Lisbon", confidence=0.6)
    await board.exchange("ana", "I think I'll stay in Lisbon for good")


async def tick(engine: Engine, clock: ManualClock, minutes: float = 0) -> list[Event]:
    """A fresh route sample, the clock moved on, one tick and its reviews; the cycles."""
    await engine.vitals.record("llm-route", {"ok": True})
    clock.advance(int(minutes * MINUTE))
    before = await engine.events.last_seq()
    await engine.tick()
    await engine.executor_loop.run_until_idle()
    return await engine.events.read(before, kinds=["awareness-cycle"])


# -- built from settings ----------------------------------------------------------------------


async def test_the_layer_named_in_config_json_reviews_with_the_key_from_the_environment(
    tmp_path: Path, chat_server: ChatServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_VARIABLE, "sk-loopback-42")
    config_json = json.dumps({"layers": {"awareness": {
        "base_url": chat_server.base_url, "model": "stand-in", "api_key_env": KEY_VARIABLE,
        "review": {"initial_delay_s": 0.01}}}})
    assert "sk-loopback-42" not in config_json
    home = tmp_path / "home"
    layers = load_layers(json.loads(config_json)["layers"], LayerContext(home, SystemClock()))
    chat_server.script(reply(change=True, narration="I noticed Ana is settling in Lisbon",
                             verbs=[{"verb": "adjust_confidence", "target": "state:city",
                                     "delta": 0.1, "reason": "she said so"}]))
    async with Engine(home, layers=layers) as engine:
        await seed(MemoryBoard(engine.events))
        engine.wake()

        async def reviewed() -> bool:
            return bool(await engine.events.read(kinds=["awareness-cycle"])) \
                and chat_server.model_probes() > 0

        await eventually(reviewed)
        (cycle,) = await engine.events.read(kinds=["awareness-cycle"])
        memory = (await engine.snapshot()).projection("memory")["ana"]
    assert cycle.data["outcome"] == "reviewed" and cycle.data["model"] == "stand-in"
    assert memory.state["city"].confidence == pytest.approx(0.7)
    assert {r.method for r in chat_server.requests} == {"GET", "POST"}  # probe and review
    assert {r.headers.get("authorization") for r in chat_server.requests} == {
        "Bearer sk-loopback-42"}


async def test_without_api_key_env_no_authorization_header_is_sent(
    tmp_path: Path, chat_server: ChatServer,
) -> None:
    reviewer = build_reviewer({"base_url": chat_server.base_url, "model": "stand-in"},
                              LayerContext(tmp_path, ManualClock()))
    chat_server.script(Stream(("hello",)))
    async with reviewer.client:
        assert await reviewer.health.check()
        await reviewer.client.complete([{"role": "user", "content": "hi"}])
    assert len(chat_server.requests) == 2
    assert all("authorization" not in r.headers for r in chat_server.requests)


def test_a_named_but_unset_key_variable_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    named = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": KEY_VARIABLE}
    context = LayerContext(tmp_path, ManualClock())
    with pytest.raises(AwarenessSettingsError, match=f"api_key_env.*{KEY_VARIABLE}.*not set"):
        layer(named, context)
    monkeypatch.setenv(KEY_VARIABLE, "")
    with pytest.raises(LayerError, match=f"'awareness'.*{KEY_VARIABLE}"):
        load_layer("awareness", named, context)


@pytest.mark.parametrize(("settings_", "field", "problem"), [
    ({"model": "m"}, "base_url", "is missing"),
    ({"base_url": "127.0.0.1:8080/v1", "model": "m"}, "`base_url`", "http://"),
    ({"base_url": "http://h/v1", "model": " "}, "`model`", "name a model"),
    ({"base_url": "http://h/v1", "model": "m", "timeout_s": "soon"}, "`timeout_s`",
     "Expected `float`"),
    ({"base_url": "http://h/v1", "model": "m", "max_wall_s": 0}, "`max_wall_s`", "> 0"),
    ({"base_url": "http://h/v1", "model": "m", "modle": "x"}, "modle", "unknown field"),
    ({"base_url": "http://h/v1", "model": "m", "review": {"interval_s": "1m"}},
     "`review.interval_s`", "Expected `float`"),
    ({"base_url": "http://h/v1", "model": "m", "review": {"verb_budget": 99}},
     "`review.verb_budget`", "1..16"),
    ({"base_url": "http://h/v1", "model": "m", "review": {"caps": {"stat": 3}}},
     "`review.caps`", "unknown field `stat`"),
    ({"base_url": "http://h/v1", "model": "m", "api_key": "sk-secret-1"}, "`api_key`",
     "never goes in config.json"),
    ({"base_url": "http://h/v1", "model": "m", "api_key_env": "sk-secret-1"},
     "`api_key_env`", "NAME of an environment variable"),
    (None, "base_url", "needs settings"),
    (["http://h/v1"], "settings", "JSON object"),
])
def test_bad_settings_are_refused_naming_the_layer_and_the_field(
    tmp_path: Path, settings_: Any, field: str, problem: str,
) -> None:
    context = LayerContext(tmp_path, ManualClock())
    for build in (layer, lambda s, c: load_layer("awareness", s, c)):
        with pytest.raises(LayerError) as refused:
            build(settings_, context)
        message = str(refused.value)
        assert "'awareness'" in message and field in message and problem in message, message
        assert "sk-secret-1" not in message  # a key pasted in the wrong place is not echoed


async def test_settings_in_python_build_the_same_layer_for_an_engine(
    tmp_path: Path, chat_server: ChatServer,
) -> None:
    typed = AwarenessSettings(base_url=chat_server.base_url, model="stand-in",
                              review=AwarenessConfig(interval_s=120))
    assert typed == msgspec.convert(
        {"base_url": chat_server.base_url, "model": "stand-in",
         "review": {"interval_s": 120}}, AwarenessSettings)
    assert "awareness" in available_layers()
    built = layer(typed, LayerContext(tmp_path / "home", ManualClock()))
    assert built.name == "awareness" and tuple(built.emits) == (AwarenessReview,)
    assert [type(p).__name__ for p in (*built.watchers, *built.executors, *built.projections)] \
        == ["ReviewRouteWatcher", "AwarenessExecutor", "AwarenessLedger"]
    engine = Engine(tmp_path / "home", layers=[built], clock=ManualClock())
    assert "awareness" in engine.rule_names


# -- the quiet hold in the side store --------------------------------------------------------


async def test_the_quiet_hold_survives_an_engine_restart_through_state_db(
    tmp_path: Path, chat_server: ChatServer,
) -> None:
    clock = ManualClock()
    home = tmp_path / "home"
    mapping = settings(chat_server, AwarenessConfig(initial_delay_s=30, quiet_hold_s=1800))
    first = build_reviewer(mapping, LayerContext(home, clock))
    engine, service = await open_engine(home, clock, first)
    try:
        await seed(MemoryBoard(engine.events))
        chat_server.script(reply())
        assert len(await tick(engine, clock, minutes=1)) == 1
        assert await tick(engine, clock, minutes=1.5) == []  # unchanged: held for 30 minutes
    finally:
        await close_engine(engine, service)
        await first.client.aclose()
    held = first.quiet.get("ana")
    assert held.skips == 1 and held.hold_until > clock.now_ms() + 20 * MINUTE
    assert await stored_holds(home, clock) == {"ana": held}

    second = build_reviewer(mapping, LayerContext(home, clock))
    engine, service = await open_engine(home, clock, second)
    try:
        for _ in range(10):
            assert await tick(engine, clock, minutes=1) == []
        assert second.rule.skips_counted == 0  # still held: not even checked
        # the same hold; the checks it deemed are made one by one again after a restart
        assert second.quiet.get("ana") == msgspec.structs.replace(held, deemed=())
        for _ in range(25):
            await tick(engine, clock, minutes=1)
        assert second.quiet.get("ana").skips == held.skips + 1  # the count carries on
    finally:
        await close_engine(engine, service)
        await second.client.aclose()
    assert (await stored_holds(home, clock))["ana"].skips == held.skips + 1


async def test_a_closed_side_store_degrades_to_no_stored_hold_reported_once_and_nothing_lost(
    tmp_path: Path, chat_server: ChatServer,
) -> None:
    clock = ManualClock()
    home = tmp_path / "home"
    reviewer = build_reviewer(settings(chat_server, AwarenessConfig(quiet_hold_s=120)),
                              LayerContext(home, clock))
    engine = Engine(home, clock=clock, layers=[reviewer.layer])
    await engine.open()
    try:
        broken = await SqliteSideStore.open(tmp_path / "closed-state.db", clock=clock)
        await broken.close()
        reviewer.quiet.bind(broken, engine.events)
        await seed(MemoryBoard(engine.events))
        chat_server.script(reply())
        (cycle,) = await tick(engine, clock, minutes=1)
        assert cycle.data["outcome"] == "reviewed"  # the reviewer works on
        for _ in range(6):
            await tick(engine, clock, minutes=1)
        in_memory = reviewer.quiet.get("ana")
        assert in_memory.skips >= 2 and reviewer.quiet.failures >= 6
        await reviewer.quiet.drain()  # nothing to write yet; the report is in
        errors = await engine.events.read(kinds=["error"])
        assert [(e.key, e.data["type"]) for e in errors] == [(WHERE, "QuietHoldUnavailable")]
        assert "StoreClosed" in errors[0].data["message"]

        reviewer.quiet.bind(engine.side, engine.events)  # the store answers again
        await tick(engine, clock)
        await reviewer.quiet.drain()
        assert await engine.side.get_all(NAMESPACE) == {
            "ana": msgspec.json.encode(reviewer.quiet.get("ana"))}
        # the same hold (its deemed checks made one by one again, the stored hold read anew)
        assert reviewer.quiet.get("ana") == msgspec.structs.replace(in_memory, deemed=())
    finally:
        await engine.close()
        await reviewer.client.aclose()


async def test_a_locked_side_store_never_holds_up_the_tick_and_the_write_lands_after(
    tmp_path: Path, chat_server: ChatServer,
) -> None:
    clock = ManualClock()
    home = tmp_path / "home"
    reviewer = build_reviewer(settings(chat_server, AwarenessConfig(quiet_hold_s=600)),
                              LayerContext(home, clock))
    engine, service = await open_engine(home, clock, reviewer)
    lock = sqlite3.connect(HomeLayout.at(home).side_db, isolation_level=None)
    try:
        await seed(MemoryBoard(engine.events))
        chat_server.script(reply())
        assert len(await tick(engine, clock, minutes=1)) == 1
        lock.execute("BEGIN IMMEDIATE")  # another writer holds state.db
        assert await tick(engine, clock, minutes=1.5) == []  # a quiet skip, written behind
        assert await tick(engine, clock, minutes=1) == []
        assert lock.execute("SELECT count(*) FROM side").fetchone() == (0,)
        lock.execute("ROLLBACK")
        await reviewer.quiet.drain()
        assert reviewer.quiet.failures == 0
        stored = await engine.side.get_all(NAMESPACE)
        assert msgspec.json.decode(stored["ana"], type=QuietState) == reviewer.quiet.get("ana")
        assert reviewer.quiet.get("ana").skips == 1
    finally:
        lock.close()
        await close_engine(engine, service)
        await reviewer.client.aclose()


async def test_skips_counted_before_the_stored_hold_loads_add_to_it(tmp_path: Path) -> None:
    side = await SqliteSideStore.open(tmp_path / "state.db", clock=ManualClock())
    try:
        await side.put(NAMESPACE, {
            "ana": msgspec.json.encode(QuietState(5, 1_000, 9_000)),
            "bo": msgspec.json.encode(QuietState(2, 1_000, 9_000)),
            "cy": msgspec.json.encode(QuietState(1, 1_000, 9_000)),
            "di": b"not json"})
        quiet = QuietHold()
        quiet.skip("ana", 2_000, 500)  # counted while the store was not there yet
        quiet.skip("bo", 2_000, 500)
        quiet.clear("bo")  # a review reported it since
        quiet.bind(side)
        quiet.write_behind()  # nothing is written before the stored hold is merged in
        assert (await side.get_all(NAMESPACE))["ana"] == msgspec.json.encode(
            QuietState(5, 1_000, 9_000))
        assert await quiet.load() and not await quiet.load()
        assert quiet.get("ana") == QuietState(6, 2_000, 2_500)
        assert quiet.get("bo") == QuietState()
        assert quiet.get("cy") == QuietState(1, 1_000, 9_000)
        assert quiet.get("di") == QuietState()
        await quiet.drain()
        stored = {k: msgspec.json.decode(v, type=QuietState)
                  for k, v in (await side.get_all(NAMESPACE)).items() if k != "di"}
        assert stored == {"ana": QuietState(6, 2_000, 2_500), "bo": QuietState(),
                          "cy": QuietState(1, 1_000, 9_000)}
    finally:
        await side.close()


async def test_a_write_that_fails_is_made_again_once_the_store_answers(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    first = await SqliteSideStore.open(path, clock=ManualClock())
    quiet = QuietHold()
    quiet.bind(first)
    assert await quiet.load()
    quiet.skip("ana", 1_000, 500)
    await first.close()  # the store goes away with the skip not yet written
    await quiet.drain()
    assert quiet.failures == 1
    again = await SqliteSideStore.open(path, clock=ManualClock())
    try:
        quiet.bind(again)
        assert await quiet.load()
        await quiet.drain()
        assert await again.get_all(NAMESPACE) == {
            "ana": msgspec.json.encode(QuietState(1, 1_000, 1_500))}
    finally:
        await again.close()


# -- surface ----------------------------------------------------------------------------------


def test_public_surface_is_pinned_and_documented() -> None:
    expected = {
        "AwarenessConfig", "AwarenessConfigError", "AwarenessExecutor", "AwarenessLedger",
        "AwarenessReview", "AwarenessRule", "AwarenessSettings", "AwarenessSettingsError",
        "CycleRecord", "Envelope", "Evidence", "EvidenceCaps", "Foreground", "GateResult",
        "InvalidEnvelope", "LedgerData", "QuietHold", "QuietHoldKeeper",
        "QuietHoldUnavailable", "QuietState", "Rejection", "ReviewRouteWatcher", "ReviewState",
        "Reviewer", "ReviewerRecords", "Verb", "build_evidence", "build_reviewer", "due_at",
        "fingerprint",
        "gate", "layer", "load_settings", "parse_envelope", "route_healthy", "shape",
        "CycleNotFound", "NothingToUndo", "UndoConflict", "UndoRefused", "undo_cycle",
        "decode_reply", "reviewer_page", "show_proposal",
        "ForegroundBegan", "ForegroundEnded", "ForegroundFollower", "NoAwarenessLayer",
        "foreground_began", "foreground_ended", "foreground_of",
    }
    assert set(pulse_adapters.awareness.__all__) == expected
    for name in expected:
        obj = getattr(pulse_adapters.awareness, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), name
        if inspect.isclass(obj) and issubclass(obj, Exception) and obj is not InvalidEnvelope:
            assert issubclass(obj, PulseError), name  # InvalidEnvelope never leaves a review
