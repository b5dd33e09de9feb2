"""`upulse events --causes`: each listed event with the events its cause leads back to and
the tick that decided it, as a table and as JSON."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pulse_core import Engine
from tests.cli.runner import Upulse
from tests.core.test_history import Runs, decide_once


async def decided_and_acked(home: Path) -> None:
    async with Engine(home, rules=[decide_once], executors=[Runs()]) as engine:
        await engine.step()
        await engine.step()


def test_events_with_causes_walk_back_from_an_outcome_to_its_effect_and_tick(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    asyncio.run(decided_and_acked(home))
    upulse = Upulse(tmp_path)
    effects, ticks = (upulse.json("events", "--home", home, "--kind", kind)
                      for kind in ("effect", "tick"))
    assert isinstance(effects, list) and isinstance(ticks, list)
    [effect], [tick] = effects, ticks
    history = upulse.json("events", "--home", home, "--key", effect["key"], "--causes")
    assert isinstance(history, list)
    assert [e["kind"] for e in history] == ["effect", "effect-executing", "effect-acked"]
    for event in history:
        assert event["tick"]["seq"] == tick["seq"]
    assert history[0]["causes"] == []
    assert [c["seq"] for c in history[2]["causes"]] == [effect["seq"]]
    table = upulse("events", "--home", home, "--key", effect["key"], "--causes").stdout
    lines = table.splitlines()
    acked = next(i for i, line in enumerate(lines) if " effect-acked " in line)
    assert lines[acked + 1].startswith(f"    <- #{effect['seq']} effect ")
    assert lines[acked + 2] == f"    <- decided by tick 1 (#{tick['seq']})"
    plain = upulse("events", "--home", home, "--key", effect["key"]).stdout
    assert "<-" not in plain
