"""The CLI knows no store backend by name: `upulse init --store`, `doctor` and the queries serve
a home whose log is kept by a third backend (tests/memory_store.py, registered through an
entry point), in one process, as they serve one on SQLite or PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from pulse_cli import config as config_file
from pulse_cli.doctor import doctor
from pulse_cli.home import Home
from pulse_cli.initialise import initialise
from pulse_cli.stores import log_file, opened, served_log
from pulse_core import EventDraft


@pytest.mark.usefixtures("memory_backend")
def test_init_doctor_and_queries_serve_a_home_on_a_third_backend(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = Home(tmp_path / "home")
    assert asyncio.run(initialise(home, "default", store="memory://fleet", as_json=True)) == 0
    created = json.loads(capsys.readouterr().out)["created"]
    assert "vitals.db" in created and "events.db" not in created  # the log is no file here
    cfg = config_file.load(home.config)
    assert cfg.store == "memory://fleet" and log_file(home, cfg) is None
    assert served_log(cfg) == "memory://fleet"  # checked by opening it, like a server's

    async def append_and_read() -> list[int]:
        async with opened(home, read_only=False) as stores:
            await stores.events.append([EventDraft("tick", "a", {"n": 1}, origin="agent")])
        async with opened(home, read_only=True) as stores:
            return [e.seq for e in await stores.events.read()]

    assert asyncio.run(append_and_read()) == [1]
    assert doctor(home, as_json=True) == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["store"]["ok"] is True
    assert checks["store"]["detail"] == "memory://fleet answers; its log holds 1 events"
