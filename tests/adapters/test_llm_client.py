"""ChatClient and RouteHealth against a real loopback chat-completions server."""

from __future__ import annotations

import asyncio
import inspect
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import pulse_adapters
import pulse_adapters.llm
from pulse_adapters.llm import (
    JSON_OBJECT,
    ChatClient,
    EmptyOutput,
    HttpStatusError,
    InferenceTimeout,
    LlmError,
    MalformedStream,
    OutputTooLarge,
    Preempted,
    RouteHealth,
    RouteProbeWatcher,
    TransportError,
    Usage,
    json_schema_format,
)
from pulse_adapters.llm.stand_in import (
    ChatServer,
    Drop,
    Hang,
    InvalidLine,
    Models,
    Status,
    Stream,
)
from pulse_adapters.llm.stream import StreamReader
from pulse_core import Engine, ManualClock, PulseError, VitalsStore
from pulse_core._watchers import sample_once
from pulse_survival.effects import Notify

TEST_TIME_LIMIT_S = 5
ASK = [{"role": "user", "content": "How are you?"}]
SCHEMA = {"type": "object", "properties": {"mood": {"type": "string"}}, "required": ["mood"],
          "additionalProperties": False}


@pytest.fixture
async def client(chat_server: ChatServer) -> AsyncIterator[ChatClient]:
    async with ChatClient(chat_server.base_url, "reviewer", timeout_s=2, max_wall_s=3) as c:
        yield c


@pytest.fixture
async def vitals(tmp_path: Path) -> AsyncIterator[VitalsStore]:
    store = await VitalsStore.open(tmp_path / "vitals.db", clock=ManualClock())
    yield store
    await store.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- completions ------------------------------------------------------------------------------


async def test_streamed_pieces_are_assembled_into_one_completion(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.script(Stream(("I am ", "fine", ", thanks."), model="qwen-7b"))
    done = await client.complete(ASK, max_tokens=50, temperature=0.2)
    assert done.text == "I am fine, thanks."
    assert done.model == "qwen-7b"
    assert done.finish_reason == "stop"
    assert done.usage == Usage(prompt_tokens=3, completion_tokens=3, total_tokens=6)
    assert 0 < done.duration_ms < 2_000
    [body] = chat_server.chat_bodies()
    assert body["model"] == "reviewer" and body["messages"] == ASK and body["stream"] is True
    assert body["max_tokens"] == 50 and body["temperature"] == 0.2
    assert "response_format" not in body


async def test_api_key_is_sent_as_a_bearer_token(chat_server: ChatServer) -> None:
    chat_server.script(Stream())
    async with ChatClient(chat_server.base_url, "m", api_key="sk-test") as client:
        await client.complete(ASK)
    assert chat_server.requests[0].headers["authorization"] == "Bearer sk-test"


async def test_cancel_event_closes_the_stream_at_once_and_raises_preempted(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.script(Stream(("word ",) * 100, delay_s=0.05))  # five seconds of tokens
    cancel = asyncio.Event()
    set_at: list[float] = []

    def preempt() -> None:
        set_at.append(time.perf_counter())
        cancel.set()

    asyncio.get_running_loop().call_later(0.2, preempt)
    with pytest.raises(Preempted, match="cancelled by its caller") as caught:
        await client.complete(ASK, cancel=cancel)
    assert time.perf_counter() - set_at[0] < 0.3
    assert not caught.value.route_failure
    assert await asyncio.to_thread(chat_server.disconnected.wait, 2)


async def test_a_cancel_event_already_set_sends_nothing(
    chat_server: ChatServer, client: ChatClient
) -> None:
    cancel = asyncio.Event()
    cancel.set()
    with pytest.raises(Preempted):
        await client.complete(ASK, cancel=cancel)
    assert chat_server.requests == []


async def test_wall_clock_cap_ends_a_slow_trickle_with_inference_timeout(
    chat_server: ChatServer,
) -> None:
    chat_server.script(Stream(("tok ",) * 100, delay_s=0.05))
    started = time.perf_counter()
    async with ChatClient(chat_server.base_url, "slow", timeout_s=2, max_wall_s=0.4) as client:
        with pytest.raises(InferenceTimeout, match=r"max_wall_s \(0.4 s\)"):
            await client.complete(ASK)
    assert 0.35 < time.perf_counter() - started < 1.0
    assert await asyncio.to_thread(chat_server.disconnected.wait, 2)


async def test_a_server_that_sends_nothing_times_out(chat_server: ChatServer) -> None:
    chat_server.script(Hang())
    async with ChatClient(chat_server.base_url, "m", timeout_s=0.3, max_wall_s=3) as client:
        with pytest.raises(InferenceTimeout, match=r"sent nothing for timeout_s \(0.3 s\)"):
            await client.complete(ASK)


async def test_http_500_raises_http_status_error_with_status_and_bounded_body(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.script(Status(500, "model crashed: " + "x" * 10_000))
    with pytest.raises(HttpStatusError) as caught:
        await client.complete(ASK)
    error = caught.value
    assert error.status == 500 and error.route_failure
    assert error.body.startswith("model crashed: ") and len(error.body) <= 300
    assert chat_server.base_url in str(error) and "'reviewer'" in str(error)
    assert isinstance(error, LlmError) and isinstance(error, PulseError)


async def test_connection_refused_raises_transport_error_naming_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    async with ChatClient(url, "m", timeout_s=1) as client:
        with pytest.raises(TransportError, match=f"{url}/chat/completions") as caught:
            await client.complete(ASK)
    assert caught.value.route_failure and caught.value.url == f"{url}/chat/completions"


async def test_a_connection_dropped_mid_stream_raises_transport_error(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.script(Drop(("half an ans",)))
    with pytest.raises(TransportError):
        await client.complete(ASK)


async def test_a_stream_without_content_raises_empty_output(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.script(Stream((), finish_reason="length"))
    with pytest.raises(EmptyOutput, match="'length'") as caught:
        await client.complete(ASK)
    assert not caught.value.route_failure


async def test_a_data_line_that_is_not_json_raises_malformed_stream(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.script(InvalidLine("data: {this is not json", pieces=("fine so far",)))
    with pytest.raises(MalformedStream, match="not JSON"):
        await client.complete(ASK)


async def test_a_data_line_nested_a_thousand_deep_raises_malformed_stream(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.script(InvalidLine("data: " + "[" * 1000 + "]" * 1000))
    with pytest.raises(MalformedStream, match="nested too deeply"):
        await client.complete(ASK)


async def test_an_answer_past_max_chars_closes_the_stream_and_raises_output_too_large(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.script(Stream(("x" * 400,) * 50, delay_s=0.01), Stream(("x" * 400,) * 2))
    with pytest.raises(OutputTooLarge, match="max_chars \\(1,000\\)") as caught:
        await client.complete(ASK, max_chars=1_000)
    assert not caught.value.route_failure
    assert chat_server.disconnected.wait(TEST_TIME_LIMIT_S)
    assert len((await client.complete(ASK, max_chars=800)).text) == 800


async def test_an_error_object_in_the_stream_raises_malformed_stream_with_its_message(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.script(InvalidLine('data: {"error": {"message": "out of memory"}}'))
    with pytest.raises(MalformedStream, match="out of memory"):
        await client.complete(ASK)


async def test_comment_and_event_lines_are_ignored(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.script(InvalidLine(": keep-alive", pieces=("still ", "here")))
    assert (await client.complete(ASK)).text == "still here"


def test_a_stream_that_stops_before_done_without_a_finish_reason_is_malformed() -> None:
    reader = StreamReader(url="http://127.0.0.1:1/v1/chat/completions", model="m")
    reader.feed('data: {"choices": [{"index": 0, "delta": {"content": "cut sh"}}]}')
    with pytest.raises(MalformedStream, match=r"ended before `data: \[DONE\]`"):
        reader.completion(1.0)
    reader.feed('data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}')
    assert reader.completion(1.0).text == "cut sh"


async def test_models_lists_the_ids_the_server_serves(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.models = Models(("qwen-7b", "llama-3-8b"))
    assert await client.models() == ["qwen-7b", "llama-3-8b"]
    chat_server.models = Status(200, "<html>a web page</html>")
    with pytest.raises(MalformedStream, match="without data"):
        await client.models()


# -- response_format --------------------------------------------------------------------------


def test_json_schema_format_is_strict_openai_shape() -> None:
    assert json_schema_format("mood", SCHEMA) == {
        "type": "json_schema", "json_schema": {"name": "mood", "schema": SCHEMA, "strict": True}}
    assert JSON_OBJECT == {"type": "json_object"}


async def test_json_schema_accepted_is_sent_as_given_and_remembered(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.script(Stream(('{"mood": "calm"}',)))
    assert client.json_schema_supported is None
    await client.complete(ASK, response_format=json_schema_format("mood", SCHEMA))
    assert chat_server.chat_bodies()[0]["response_format"]["json_schema"]["schema"] == SCHEMA
    assert client.json_schema_supported is True


async def test_json_schema_refused_is_retried_once_as_json_object_and_remembered(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.rejects_json_schema = True
    chat_server.script(Stream(('{"mood": "calm"}',)), Stream(('{"mood": "tired"}',)))
    fmt = json_schema_format("mood", SCHEMA)
    first = await client.complete(ASK, response_format=fmt)
    second = await client.complete(ASK, response_format=fmt)
    assert (first.text, second.text) == ('{"mood": "calm"}', '{"mood": "tired"}')
    sent = [body["response_format"]["type"] for body in chat_server.chat_bodies()]
    assert sent == ["json_schema", "json_object", "json_object"]
    assert client.json_schema_supported is False


async def test_a_400_that_json_object_does_not_cure_is_raised_and_not_remembered(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.script(Status(400, "context length exceeded"), Status(400, "context length"))
    with pytest.raises(HttpStatusError, match="HTTP 400") as caught:
        await client.complete(ASK, response_format=json_schema_format("mood", SCHEMA))
    assert not caught.value.route_failure
    assert len(chat_server.chat_bodies()) == 2
    assert client.json_schema_supported is None


# -- route health -----------------------------------------------------------------------------


async def test_route_health_answers_from_cache_within_the_ttl(
    chat_server: ChatServer, client: ChatClient
) -> None:
    clock = ManualClock()
    health = RouteHealth(client, ttl_s=30, clock=clock)
    results = await asyncio.gather(*(health.check() for _ in range(5)))
    clock.advance(29_000)
    assert await health.check()
    assert all(results) and chat_server.model_probes() == 1
    clock.advance(1_000)
    assert await health.check()
    assert chat_server.model_probes() == 2


async def test_poison_makes_the_route_unhealthy_at_once_until_a_probe_after_the_ttl(
    chat_server: ChatServer, client: ChatClient
) -> None:
    clock = ManualClock()
    health = RouteHealth(client, ttl_s=30, clock=clock)
    assert await health.check()
    health.poison("stream broke mid-way")
    assert not await health.check()
    assert health.reading is not None and "stream broke" in str(health.reading["error"])
    clock.advance(29_999)
    assert not await health.check() and chat_server.model_probes() == 1
    clock.advance(1)
    assert await health.check() and chat_server.model_probes() == 2


async def test_probes_write_llm_route_vitals_with_ok_true_and_false(
    chat_server: ChatServer, client: ChatClient, vitals: VitalsStore
) -> None:
    clock = vitals.clock
    assert isinstance(clock, ManualClock)
    health = RouteHealth(client, vitals, ttl_s=10)
    assert await health.check()
    chat_server.models = Status(503, "loading model")
    clock.advance(10_000)
    assert not await health.check()
    samples = await vitals.window("llm-route", 0)
    assert [s.data["ok"] for s in samples] == [True, False]
    assert samples[0].data["via"] == "models" and samples[0].data["error"] is None
    assert samples[0].data["latency_ms"] >= 0
    assert "HTTP 503" in samples[1].data["error"]


async def test_probe_falls_back_to_a_one_token_completion_where_models_is_404(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.models = Status(404, "not found")
    chat_server.script(Stream(()))  # an empty answer still proves the route
    reading = await RouteHealth(client).probe()
    assert reading["ok"] and reading["via"] == "completion"
    [body] = chat_server.chat_bodies()
    assert body["max_tokens"] == 1


async def test_a_probe_that_gets_no_answer_reads_not_ok_within_its_timeout(
    chat_server: ChatServer, client: ChatClient
) -> None:
    chat_server.models = Hang()
    started = time.perf_counter()
    reading = await RouteHealth(client, probe_timeout_s=0.3).probe()
    assert time.perf_counter() - started < 1.0
    assert not reading["ok"] and "probe_timeout_s (0.3 s)" in reading["error"]


async def test_probe_watcher_sample_is_the_only_vitals_write_and_feeds_check(
    chat_server: ChatServer, client: ChatClient, vitals: VitalsStore
) -> None:
    health = RouteHealth(client, vitals, ttl_s=30)
    watcher = RouteProbeWatcher(health)
    assert (watcher.name, watcher.key, watcher.interval) == ("llm-route", "llm-route", 30)
    sample = await sample_once(watcher, vitals)
    assert sample.ok and sample.data["ok"] is True
    assert await health.check()
    assert chat_server.model_probes() == 1
    assert len(await vitals.window("llm-route", 0)) == 1


async def test_llm_watchdog_reads_the_probe_watcher_samples(
    chat_server: ChatServer, client: ChatClient, tmp_path: Path
) -> None:
    chat_server.models = Status(502, "bad gateway")
    clock = ManualClock()
    engine = Engine(tmp_path / "home", clock=clock,
                    watchers=[RouteProbeWatcher(RouteHealth(client, clock=clock))])
    await engine.open()
    try:
        for _ in range(3):
            clock.advance(1_000)
            decision = await engine.step()
        notices = [e for e in decision.effects if isinstance(e, Notify) and e.topic == "llm"]
        assert notices and "failed 3 probes in a row" in notices[0].text
    finally:
        await engine.close()


# -- surface ----------------------------------------------------------------------------------


def test_public_surface_is_pinned_and_documented() -> None:
    expected = {
        "JSON_OBJECT", "ChatClient", "Completion", "EmptyOutput", "HttpStatusError",
        "InferenceTimeout", "LlmError", "MalformedStream", "OutputTooLarge", "Preempted",
        "RouteHealth", "ROUTE_KEY", "ModelEndpoint", "excerpt", "ChatServer", "Stream",
        "RouteProbeWatcher", "TransportError", "Usage", "json_schema_format",
    }
    assert set(pulse_adapters.llm.__all__) == expected
    for name in expected:
        obj = getattr(pulse_adapters.llm, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), name
        if inspect.isclass(obj) and issubclass(obj, Exception):
            assert issubclass(obj, LlmError)


def test_every_layer_that_calls_a_model_describes_its_route_with_one_struct() -> None:
    from pulse_adapters.awareness import AwarenessSettings
    from pulse_adapters.hermes import load_settings as hermes_settings
    from pulse_adapters.llm import ROUTE_KEY, ModelEndpoint
    from pulse_adapters.maintenance import MaintenanceSettings
    from pulse_adapters.openclaw import load_settings as openclaw_settings
    from pulse_survival import SurvivalConfig

    routes = [AwarenessSettings(base_url="http://h/v1", model="m"),
              MaintenanceSettings().consolidation,
              openclaw_settings({}).model,
              hermes_settings({}).model]
    assert all(isinstance(r, ModelEndpoint) for r in routes)
    # the probes write where the survival layer's llm_watchdog reads
    assert {r.route_key for r in routes} == {ROUTE_KEY} == {SurvivalConfig().llm.route_key}
    assert ModelEndpoint(model=" ").endpoint_problem(required=False) == (
        "model", "must name a model the server serves, e.g. 'qwen2.5-7b-instruct'")
    assert ModelEndpoint().endpoint_problem(required=False) is None
    assert ModelEndpoint().endpoint_problem(required=True) is not None
    assert ModelEndpoint(api_key_env="OPENAI_API_KEY\n").endpoint_problem(required=False) == (
        "api_key_env", "must be the NAME of an environment variable (letters, digits, _; e.g. "
        "OPENAI_API_KEY), not the key itself")
    assert ModelEndpoint(timeout_s=float("inf")).endpoint_problem(required=False) == (
        "timeout_s", "must be a finite number > 0 seconds (got inf)")
    assert ModelEndpoint(api_key_env="K").key_problem({}) is not None
    assert ModelEndpoint(api_key_env="K").key_problem({"K": "v"}) is None


@pytest.mark.parametrize(("layer", "settings", "says"), [
    ("hermes", {"model": {"default": "m"}}, "unknown field `default` (renamed: now `model`)"),
    ("openclaw", {"model": {"vitals_key": "x"}},
     "unknown field `vitals_key` (renamed: now `route_key`)"),
    ("openclaw", {"model": {"interval_s": 30}},
     "unknown field `interval_s` (renamed: now `route_ttl_s`)"),
    ("awareness", {"base_url": "http://h/v1", "model": "m", "review": {"route_key": "x"}},
     "unknown field `route_key` (renamed: now `route_key`, beside base_url and model"),
])
def test_a_renamed_route_field_is_refused_with_its_new_name(
    layer: str, settings: dict[str, object], says: str,
) -> None:
    import importlib

    load = importlib.import_module(f"pulse_adapters.{layer}").load_settings
    with pytest.raises(Exception) as refused:
        load(settings)
    assert says in str(refused.value)
