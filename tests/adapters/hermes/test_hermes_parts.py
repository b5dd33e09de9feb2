"""The hermes layer's and plugin's parts on real stores in tmp_path: settings errors name their
field, the layer's shape, notices offered once across processes, the bridge as a client of an
engine that holds the home, a failing job recorded and survived, and Hermes' kanban hooks
(through Hermes' own plugin manager) mirrored as pulse tasks."""

from __future__ import annotations

import asyncio
import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from pulse_adapters.hermes import (
    HermesPlugin,
    HermesSettingsError,
    NoticeFollower,
    PluginSettings,
    PulseBridge,
    build_hermes,
    plugin_settings,
)
from pulse_core import Engine, EventStore, LayerContext, Principal, SystemClock, TaskBoard
from pulse_core._effects import effect_draft
from pulse_survival import find_process
from pulse_survival.effects import Notify

TEST_TIME_LIMIT_S = 30


@pytest.mark.parametrize(("settings", "names"), [
    ({"progam": "hermes"}, "layers.hermes: unknown field `progam` (did you mean `program`?)"),
    ({"model": {"base_url": "ftp://x"}}, "setting `layers.hermes.model.base_url` must start"),
    ({"model": {"base_url": "http://127.0.0.1:1/v1"}}, "`layers.hermes.model.model` must"),
    ({"agents": [{"name": "a"}, {"name": "a"}]}, "`layers.hermes.agents` names must be unique"),
    ({"run_timeout_s": 0}, "setting `layers.hermes.run_timeout_s` must be > 0 seconds"),
    ({"extra_args": ["-z"]}, "setting `layers.hermes.extra_args` may not hold -z"),
])
def test_a_wrong_setting_is_named_with_its_field(tmp_path: Path, settings: dict[str, Any],
                                                 names: str) -> None:
    with pytest.raises(HermesSettingsError) as caught:
        build_hermes(settings, LayerContext(tmp_path, SystemClock()))
    assert names in str(caught.value)


def test_the_layer_declares_its_gateway_and_probes_the_route_it_is_given(tmp_path: Path
                                                                          ) -> None:
    parts = build_hermes({"home": str(tmp_path / "h"), "gateway": True,
                          "agents": [{"name": "h1"}],
                          "model": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}},
                         LayerContext(tmp_path, SystemClock()))
    layer = parts.layer
    Engine(tmp_path / "pulse", layers=[layer])  # what an engine refuses, it refuses here
    assert [w.name for w in layer.watchers] == ["hermes-home", "hermes-llm-route"]
    assert [w.key for w in layer.watchers] == ["hermes", "llm-route"]
    (gateway,) = layer.essentials
    assert gateway.argv == ("hermes", "gateway", "run", "--replace")
    assert gateway.env == {"HERMES_HOME": str(tmp_path / "h"),
                           "HERMES_DISABLE_LAZY_INSTALLS": "1"}
    assert [r.name for r in layer.rules] == ["hermes-run-dispatcher"]
    watch_only = build_hermes(None, LayerContext(tmp_path, SystemClock())).layer
    assert watch_only.rules == () and watch_only.essentials == ()


@contextmanager
def gateways(homes: list[Path]) -> Iterator[list[int]]:
    """A stand-in gateway for each Hermes home (every command line ends `hermes gateway run`,
    as each real gateway's is the same), each running with its HERMES_HOME: their pids."""
    with ExitStack() as running:
        pids = []
        for home in homes:
            env = {**os.environ, "HERMES_HOME": str(home)}
            gateway = running.enter_context(subprocess.Popen(
                [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()",
                 "hermes", "gateway", "run"], env=env, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE))
            assert gateway.stdout is not None and gateway.stdout.readline().strip() == "up"
            running.callback(gateway.wait, 30)
            assert gateway.stdin is not None
            running.callback(gateway.stdin.close)
            pids.append(gateway.pid)
        yield pids


def test_each_instance_finds_its_own_hermes_homes_gateway_never_another_ones(
        tmp_path: Path) -> None:
    """Two pulse instances on one machine, each with a Hermes gateway of its own home: the
    survival layer of each keeps its own alive, so must never take the other's for it."""
    homes = [tmp_path / "hermes-a", tmp_path / "hermes-b", tmp_path / "hermes-c"]
    essential = [build_hermes({"home": str(home), "gateway": True},
                              LayerContext(tmp_path / f"pulse-{n}", SystemClock())
                              ).layer.essentials[0] for n, home in enumerate(homes)]
    for first in (homes[:2], homes[1::-1]):  # whichever started first
        with gateways(first) as found:
            pid_of = dict(zip(first, found, strict=True))
            for home, spec in zip(homes[:2], essential[:2], strict=True):
                process = find_process(spec)
                assert process is not None and process.pid == pid_of[home]
            assert find_process(essential[2]) is None  # its gateway is down: restart it


def test_plugin_settings_take_the_environment_over_hermes_config() -> None:
    entry = {"identity": "ana", "allow_tool_override": False, "notice_wait_s": 0.2}
    settings = plugin_settings(entry, {"PULSE_HOME": "/srv/pulse", "PULSE_HERMES_NOTICES": "0"})
    assert (settings.home, settings.identity, settings.notices) == ("/srv/pulse", "ana", ())
    assert plugin_settings({"home": "/x"}, {"UPULSE_HOME": "/y"}).home == "/x"
    assert plugin_settings(None, {"UPULSE_HOME": "/y"}).home == "/y"
    assert plugin_settings({"bogus": 1}, {}).identity == "owner"  # logged, defaults used


async def test_a_notice_is_claimed_by_one_follower_only(tmp_path: Path) -> None:
    async with Engine(tmp_path / "pulse") as engine:
        await engine.append([effect_draft(Notify(topic="t", level="critical", text="down"),
                                          origin="survival")])
        now = engine.clock.now_ms()
        first = NoticeFollower(["notify"], max_age_ms=60_000)
        second = NoticeFollower(["notify"], max_age_ms=60_000)
        claimed = await asyncio.gather(first.claim(engine.events, now),
                                       second.claim(engine.events, now))
        assert sorted(map(len, claimed)) == [0, 1]
        assert await first.claim(engine.events, now) == []
        stale = NoticeFollower(["notify"], max_age_ms=1)
        await engine.append([effect_draft(Notify(topic="t", level="notice", text="old"),
                                          origin="survival")])
        assert await stale.claim(engine.events, now + 60_000) == []


async def test_the_bridge_is_a_client_of_an_engine_that_holds_the_home_and_survives_a_failure(
        tmp_path: Path) -> None:
    async with Engine(tmp_path / "pulse") as engine:
        bridge = PulseBridge(engine.home, name="hermes-plugin",
                             principal=Principal.agent("hermes", "hermes-plugin"))
        bridge.start()

        async def broken(events: EventStore) -> None:
            raise RuntimeError("the plugin broke")

        async def written(events: EventStore) -> int:
            return (await TaskBoard(events, origin="agent").create("t-9", "after")).seq

        bridge.submit(broken, "broken")
        seq = await asyncio.to_thread(bridge.call, written, "write", timeout_s=60.0)
        await asyncio.to_thread(bridge.close)
        assert bridge.mode == "closed"
        assert seq is not None
        errors = await engine.events.read(kinds=["error"], key="agent:hermes-plugin:broken")
        assert [e.data["message"] for e in errors] == ["the plugin broke"]
        assert (await TaskBoard(engine.events).state("t-9")) is not None


async def test_kanban_hooks_through_hermes_plugin_manager_become_one_pulse_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    plugins: Any = importlib.import_module("hermes_cli.plugins")  # hermes-agent: test extra
    manager = plugins.PluginManager()
    ctx = plugins.PluginContext(plugins.PluginManifest(name="pulse", source="entrypoint",
                                                       key="pulse"), manager)
    plugin = HermesPlugin(PluginSettings(home=str(tmp_path / "pulse"), embed=False))
    async with Engine(tmp_path / "pulse") as engine:
        await asyncio.to_thread(plugin.register, ctx)
        common = {"task_id": "k-1", "board": "default", "assignee": "coder", "run_id": 7,
                  "profile_name": "default"}
        manager.invoke_hook("kanban_task_claimed", **common)
        manager.invoke_hook("kanban_task_completed", summary="shipped", **common)
        manager.invoke_hook("kanban_task_completed", summary="shipped", **common)  # again
        await asyncio.to_thread(plugin.bridge.flush, 60.0)
        await asyncio.to_thread(plugin.close)
        board = TaskBoard(engine.events)
        task = await board.state("hermes:default:k-1:7")
        kinds = [e.kind for e in await engine.events.read(key="hermes:default:k-1:7")]
    assert task is not None and task.status == "closed"
    assert (task.agent, task.project) == ("hermes:coder", "hermes-kanban")
    assert task.result == {"summary": "shipped", "run_id": 7}
    assert kinds == ["task-created", "task-assigned", "task-executing", "task-acked",
                     "task-closed"]


def test_a_hook_that_fails_never_raises_into_hermes(tmp_path: Path) -> None:
    plugin = HermesPlugin(PluginSettings(home=str(tmp_path / "pulse"), notices=()))
    plugin.bridge.start()
    assert plugin.pre_llm_call(session_id="s", user_message=object()) is None
    assert plugin.post_llm_call(session_id=None, assistant_response=None) is None
    plugin.kanban(hook="kanban_task_claimed", task_id=None)  # wrong arguments: logged
    plugin.close()
