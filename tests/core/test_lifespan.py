"""A layer's lifespan: what it holds open while the engine runs, entered as the engine opens
(before any service runs) and exited as it closes (after its services stopped), in reverse
layer order; a failure to open names the layer, a failure to close is an `error` event."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pulse_core import (
    Decision,
    Effect,
    Engine,
    ExecutionContext,
    Executor,
    Inner,
    Layer,
    LayerOpenFailed,
    Lifespan,
    ManualClock,
    Service,
    Snapshot,
    emits,
)
from tests.timing import eventually


def journal(said: list[str], name: str, *, fail_open: bool = False,
            fail_close: bool = False) -> Lifespan:
    """A lifespan that writes what happens to it into `said`."""

    @contextlib.asynccontextmanager
    async def lifespan(engine: Engine) -> AsyncIterator[None]:
        said.append(f"{name} open")
        if fail_open:
            raise ConnectionRefusedError(f"{name} could not connect")
        try:
            yield
        finally:
            said.append(f"{name} close (stores open: {engine._stores is not None})")
            if fail_close:
                raise OSError(f"{name} could not flush")

    return lifespan


def running(said: list[str], name: str) -> Service:
    """A service that says when it runs and when it stops."""

    async def service(engine: Engine) -> None:
        said.append(f"{name} service runs")
        try:
            await asyncio.Event().wait()
        finally:
            said.append(f"{name} service stopped")

    service.name = f"{name}-service"  # type: ignore[attr-defined]
    return service


async def test_a_lifespan_opens_before_services_run_and_closes_after_they_stopped_last_first(
        tmp_path: Path) -> None:
    said: list[str] = []
    layers = [Layer(name, services=[running(said, name)], lifespan=journal(said, name))
              for name in ("first", "second")]
    engine = Engine(tmp_path / "home", layers=layers, clock=ManualClock())
    async with engine:
        await eventually(lambda: len(said) == 4, what="both services to run")
        assert said[:2] == ["first open", "second open"]
    assert said[4:] == ["first service stopped", "second service stopped",
                        "second close (stores open: True)", "first close (stores open: True)"]


class Slow(Effect, tag="lifespan-test-slow"):
    """An effect whose attempt is still running when the engine closes."""


class SlowExecutor(Executor):
    handles = (Slow,)

    def __init__(self, said: list[str]) -> None:
        self.said = said

    async def execute(self, effect: Slow, ctx: ExecutionContext) -> None:
        self.said.append("attempt runs")
        await asyncio.sleep(0.2)  # still running when close begins: the drain waits for it
        self.said.append("attempt done")


@emits(Slow)
async def slow_once(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    effects, tick_ms = await inner(prev, curr)
    return Decision([*effects, Slow()] if curr.number == 1 else effects, tick_ms)


async def test_a_lifespan_closes_after_the_effects_in_flight_drained(tmp_path: Path) -> None:
    said: list[str] = []
    layer = Layer("slow", rules=[slow_once], executors=[SlowExecutor(said)],
                  lifespan=journal(said, "client"))
    async with Engine(tmp_path / "home", layers=[layer]):
        await eventually(lambda: "attempt runs" in said, what="the attempt to start")
    assert said == ["client open", "attempt runs", "attempt done",
                    "client close (stores open: True)"]


async def test_a_lifespan_that_fails_to_open_names_its_layer_and_what_opened_is_closed(
        tmp_path: Path) -> None:
    said: list[str] = []
    home = tmp_path / "home"
    engine = Engine(home, layers=[Layer("pool", lifespan=journal(said, "pool")),
                                  Layer("broken", lifespan=journal(said, "broken",
                                                                   fail_open=True)),
                                  Layer("never", lifespan=journal(said, "never"))])
    with pytest.raises(LayerOpenFailed, match=r"layer 'broken' failed to open .*"
                                              r"ConnectionRefusedError: broken could not"):
        await engine.open()
    assert said == ["pool open", "broken open", "pool close (stores open: True)"]
    async with Engine(home) as again:  # the home was released
        stopped = await again.events.read(kinds=["engine-started", "engine-stopped"])
    assert [e.kind for e in stopped][:2] == ["engine-started", "engine-stopped"]


async def test_a_lifespan_that_fails_to_close_is_an_error_event_and_the_others_still_close(
        tmp_path: Path) -> None:
    said: list[str] = []
    home = tmp_path / "home"
    engine = Engine(home, layers=[Layer("pool", lifespan=journal(said, "pool")),
                                  Layer("leaky", lifespan=journal(said, "leaky",
                                                                  fail_close=True))])
    await engine.open()
    await engine.close()
    assert said[2:] == ["leaky close (stores open: True)", "pool close (stores open: True)"]
    async with Engine(home) as again:
        events = await again.events.read(kinds=["error", "engine-stopped"])
    (error,) = [e for e in events if e.kind == "error"]
    assert error.key == "layer:leaky" and error.origin == "engine"
    assert error.data["type"] == "OSError" and "leaky could not flush" in error.data["message"]
    assert events.index(error) < [e.kind for e in events].index("engine-stopped")


async def test_an_engine_built_again_closes_the_old_lifespan_before_the_new_one_opens(
        tmp_path: Path) -> None:
    """What a reload (promote, rollback, SIGHUP) does: the running engine closes, then the
    one built from the same layers' factories opens."""
    said: list[str] = []
    home = tmp_path / "home"

    def build(generation: int) -> Engine:
        return Engine(home, layers=[Layer("pool", lifespan=journal(said, f"pool {generation}"))])

    async with build(1):
        pass
    async with build(2):
        assert said == ["pool 1 open", "pool 1 close (stores open: True)", "pool 2 open"]
