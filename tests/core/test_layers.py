"""Layers: bundles that plug into an engine, found by name through entry points."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pulse_core import (
    Decision,
    Effect,
    Engine,
    ExecutionContext,
    Executor,
    Inner,
    Layer,
    LayerContext,
    LayerError,
    ManualClock,
    Projection,
    Snapshot,
    SurvivalLocked,
    UnhandledEffect,
    available_layers,
    emits,
    layer_settings,
    load_layer,
    settings_problem,
)
from pulse_core._events import Event


class Wave(Effect, tag="layer-wave"):
    n: int


class Waves(Projection[int]):
    name = "waves"
    kinds = frozenset({"effect-acked"})

    def initial(self) -> int:
        return 0

    def apply(self, state: int, event: Event) -> int:
        return state + 1


class WaveExecutor(Executor):
    handles = (Wave,)

    async def execute(self, effect: Wave, ctx: ExecutionContext) -> int:
        return effect.n


@emits(Wave)
async def wave_once(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    effects, tick_ms = await inner(prev, curr)
    if curr.state(Waves) == 0 and not curr.pending_effects:
        effects = [*effects, Wave(n=curr.number)]
    return Decision(effects, tick_ms)


def waving_layer() -> tuple[Layer, list[str]]:
    served: list[str] = []

    async def service(engine: Engine) -> None:
        served.append("started")
        try:
            await asyncio.sleep(3600)
        finally:
            served.append("stopped")

    return Layer("waving", rules=[wave_once], executors=[WaveExecutor()],
                 projections=[Waves()], services=[service]), served


async def test_a_layer_brings_its_rules_executors_projections_and_services(
    tmp_path: Path,
) -> None:
    layer, served = waving_layer()
    engine = Engine(tmp_path, layers=[layer], clock=ManualClock())
    async with engine:
        await engine.step()
        await engine.step()
        assert (await engine.snapshot()).state(Waves) == 1
        for _ in range(500):
            if served:
                break
            await asyncio.sleep(0.01)
        assert served == ["started"]
    assert served == ["started", "stopped"]
    (acked,) = await _read(tmp_path, "effect-acked")
    assert acked.data["result"] == 1


async def test_the_chain_is_survival_then_builtins_then_layers_then_business(
    tmp_path: Path,
) -> None:
    async def mine(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        return await inner(prev, curr)

    layer, _ = waving_layer()
    engine = Engine(tmp_path, layers=[layer], rules=[mine])
    tiers = [tier for tier, _ in engine.chain.tiers]
    assert tiers[0] == "survival" and tiers[-2:] == ["waving", "business"]
    assert tiers.index("builtin") < tiers.index("waving")
    assert engine.rule_names[-2:] == ("wave_once", "mine")
    assert engine.rule_names[0] == "panic_rollback"


def _entering(name: str, entered: list[str], *, bypass: bool = False) -> Any:
    async def rule(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        entered.append(name)
        return Decision([], 60_000) if bypass else await inner(prev, curr)

    rule.name = name  # type: ignore[attr-defined]
    return rule


async def test_the_chain_that_runs_enters_builtins_then_layers_then_business(
    tmp_path: Path,
) -> None:
    entered: list[str] = []
    engine = Engine(tmp_path, layers=[Layer("extra", rules=[_entering("layer", entered)])],
                    rules=[_entering("business", entered)],
                    builtin_rules=[_entering("builtin", entered)], clock=ManualClock())
    await engine.open()
    await engine.tick()
    await engine.close()
    assert entered == ["builtin", "layer", "business"]


async def test_a_builtin_rule_that_bypasses_cannot_silence_a_survival_rule(
    tmp_path: Path,
) -> None:
    entered: list[str] = []
    engine = Engine(tmp_path, layers=[Layer("extra", rules=[_entering("layer", entered)])],
                    builtin_rules=[_entering("builtin", entered, bypass=True)],
                    clock=ManualClock())
    await engine.open()
    await engine.tick()
    await engine.close()
    reached = {t.rule: t.reached for t in engine.trace}
    survival = [name for tier, name in engine.chain.tiers if tier == "survival"]
    assert survival and all(reached[name] for name in survival)  # outside the bypass
    assert entered == ["builtin"] and not reached["layer"]


async def test_the_trace_says_what_each_rule_did_in_the_last_tick(tmp_path: Path) -> None:
    async def broken(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        raise ValueError("bad rule")

    layer, _ = waving_layer()
    engine = Engine(tmp_path, layers=[layer], rules=[broken], clock=ManualClock())
    async with engine:
        await engine.tick()
    trace = {t.rule: t for t in engine.trace}
    assert trace["wave_once"].effects == ("layer-wave",)
    assert trace["broken"].error == "ValueError: bad rule"
    assert trace["panic_rollback"].reached and trace["panic_rollback"].tier == "survival"


def test_a_layer_cannot_bring_a_survival_rule(tmp_path: Path) -> None:
    async def process_watchdog(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        return await inner(prev, curr)

    with pytest.raises(SurvivalLocked, match="process_watchdog"):
        Engine(tmp_path, layers=[Layer("sneaky", rules=[process_watchdog])])


def test_a_rule_that_emits_an_effect_nobody_handles_is_refused_at_build(tmp_path: Path) -> None:
    with pytest.raises(UnhandledEffect, match=r"wave_once.*'layer-wave'.*add an executor"):
        Engine(tmp_path, rules=[wave_once])
    with pytest.raises(UnhandledEffect, match="layer-wave"):
        Engine(tmp_path, layers=[Layer("quiet", emits=[Wave])])


def test_layer_names_are_unique(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="repeated: twice"):
        Engine(tmp_path, layers=[Layer("twice"), Layer("twice")])


def test_an_unknown_layer_is_a_clear_error_naming_what_is_installed(tmp_path: Path) -> None:
    context = LayerContext(tmp_path, ManualClock())
    with pytest.raises(LayerError, match=r"no layer named 'nope'.*installed: .*awareness"):
        load_layer("nope", None, context)


def _plugin(site: Path, dist: str, group: str, name: str, module: str, *, body: str) -> None:
    """A real installed distribution (dist-info with entry_points.txt) on a sys.path entry."""
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {module}:layer\n")
    (site / f"{module}.py").write_text(textwrap.dedent(body))


def test_a_third_party_layer_registers_itself_like_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _plugin(site, "pulse_greeter", "pulse.layers", "greeter", "pulse_greeter_layer", body="""
        from pulse_core import Layer

        def layer(settings, context):
            if not isinstance(settings, dict) or "greeting" not in settings:
                raise ValueError("settings.greeting is required")
            return Layer("greeter")
        """)
    monkeypatch.syspath_prepend(str(site))
    context = LayerContext(tmp_path, ManualClock())
    assert "greeter" in available_layers()
    assert load_layer("greeter", {"greeting": "hi"}, context).name == "greeter"
    with pytest.raises(LayerError, match=r"layer 'greeter' refused its settings.*greeting"):
        load_layer("greeter", {}, context)


def test_a_broken_layer_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    _plugin(site, "pulse_broken", "pulse.layers", "broken", "pulse_broken_layer",
            body="import no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(LayerError, match=r"layer 'broken' .* failed to import.*no_such_module"):
        load_layer("broken", None, LayerContext(tmp_path, ManualClock()))


def test_the_engine_refuses_to_run_with_a_second_survival_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _plugin(site, "pulse_fake_survival", "pulse.survival", "survival", "fake_survival", body="""
        from pulse_core import Layer

        def layer(settings, context):
            return Layer("survival")
        """)
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(LayerError, match="exactly one survival layer"):
        Engine(tmp_path / "home")


async def _read(home: Path, kind: str) -> list[Any]:
    from pulse_core import open_home

    stores = await open_home(home, read_only=True)
    try:
        return await stores.events.read(kinds=[kind])
    finally:
        await stores.close()


def test_two_watchers_with_one_name_are_refused_at_build(tmp_path: Path) -> None:
    from pulse_core import Watcher

    class Probe(Watcher):
        async def collect(self) -> int:
            return 1

    with pytest.raises(Exception, match=r"watcher names must be unique.*Probe"):
        Engine(tmp_path, watchers=[Probe(), Probe()])


def test_two_executors_for_one_effect_type_are_refused_at_build(tmp_path: Path) -> None:
    from pulse_survival import Notify

    class MyNotify(Executor):
        handles = (Notify,)

        async def execute(self, effect: Notify, ctx: ExecutionContext) -> None:
            return None

    # Refused when the engine is built, so a daemon falls back to the survival layer alone.
    with pytest.raises(Exception, match=r"'notify' is handled by both NotifyExecutor.*MyNotify"):
        Engine(tmp_path, executors=[MyNotify()])


def test_a_watcher_without_a_positive_interval_is_refused(tmp_path: Path) -> None:
    from pulse_core import Watcher

    class Busy(Watcher):
        interval = 0

        async def collect(self) -> int:
            return 1

    with pytest.raises(Exception, match=r"watcher 'Busy' has interval=0"):
        Engine(tmp_path, watchers=[Busy()])


class _Worker(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    repo: str = ""


class _Fleet(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    workers: tuple[_Worker, ...] = ()
    lead: _Worker | None = None


def test_settings_problem_names_an_unknown_field_inside_a_list_item() -> None:
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.convert({"workers": [{"name": "a"}, {"name": "b", "rpeo": "/x"}]}, _Fleet)
    assert settings_problem(_Fleet, caught.value) == (
        "setting `workers[1]`: unknown field `rpeo` (did you mean `repo`?) — allowed: name, "
        "repo")
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.convert({"lead": {"nme": "a"}}, _Fleet)
    assert settings_problem(_Fleet, caught.value).startswith(
        "setting `lead`: unknown field `nme` (did you mean `name`?)")


async def test_a_failing_service_is_recorded_under_its_own_key_and_does_not_slow_the_ticks(
        tmp_path: Path) -> None:
    broke = asyncio.Event()

    async def follower(engine: Engine) -> None:
        broke.set()
        raise RuntimeError("the transcript folder is gone")

    engine = Engine(tmp_path, clock=ManualClock(), layers=[Layer("f", services=[follower])])
    async with engine:
        await asyncio.wait_for(broke.wait(), 10)
        await engine.supervisor.settle()
        for _ in range(100):
            if await engine.events.read(kinds=["error"]):
                break
            await asyncio.sleep(0.02)
        (error,) = await engine.events.read(kinds=["error"])
        assert error.key == "service:follower", error.key
        assert (await engine.snapshot()).projection("errors") == ()


class _FleetError(LayerError):
    pass


def test_layer_settings_names_each_problem_from_config_json_s_root() -> None:
    assert layer_settings(None, _Fleet, _FleetError, "fleet") == _Fleet()
    kept = _Fleet(lead=_Worker("a"))
    assert layer_settings(kept, _Fleet, _FleetError, "fleet") is kept
    assert layer_settings({"workers": [{"name": "a"}]}, _Fleet, _FleetError,
                          "fleet").workers == (_Worker("a"),)
    with pytest.raises(_FleetError, match=r"^layers\.fleet must be a JSON object .* not list"):
        layer_settings([], _Fleet, _FleetError, "fleet")
    with pytest.raises(_FleetError) as caught:
        layer_settings({"workers": [{"name": "a", "rpeo": "/x"}]}, _Fleet, _FleetError, "fleet")
    assert str(caught.value).startswith(
        "setting `layers.fleet.workers[0]`: unknown field `rpeo` (did you mean `repo`?)")
    with pytest.raises(_FleetError, match=r"^layers\.fleet: unknown field `wokers`"):
        layer_settings({"wokers": []}, _Fleet, _FleetError, "fleet")
