"""What the hermes layer senses: Hermes' home (its session store's size, its gateway's pid
record) read from files, and its model route through pulse_adapters.llm's probe.

`hermes status` and `hermes doctor` are not run: they print for humans (no machine-readable
form in 0.19.0), take 0.9 s and 2.3 s, and doctor checks 29 remote endpoints.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

from pulse_adapters.hermes._settings import HermesModel
from pulse_adapters.llm import ChatClient, RouteProbeWatcher
from pulse_core import Clock, Watcher


def gateway_pid(hermes_home: Path) -> int | None:
    """The pid in Hermes' gateway.pid (a JSON record, or a bare number) if that process
    lives; None otherwise."""
    try:
        raw = (hermes_home / "gateway.pid").read_text(encoding="utf-8").strip()
        record = json.loads(raw)
        pid = int(record["pid"] if isinstance(record, dict) else record)
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid


def read_home(hermes_home: Path) -> dict[str, Any]:
    """One reading of Hermes' home (blocking): whether it exists, the session store's size
    and counts, and the gateway's pid."""
    db = hermes_home / "state.db"
    reading: dict[str, Any] = {"home": str(hermes_home), "exists": hermes_home.is_dir(),
                               "gateway_pid": gateway_pid(hermes_home),
                               "state_db_bytes": db.stat().st_size if db.exists() else 0,
                               "sessions": None, "messages": None}
    if db.exists():
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=2.0)
        try:
            reading["sessions"] = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
            reading["messages"] = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        finally:
            conn.close()
    reading["gateway"] = reading["gateway_pid"] is not None
    return reading


class HermesHomeWatcher(Watcher):
    """Hermes' home every `interval` seconds, under vitals key `hermes`."""

    name = "hermes-home"
    key = "hermes"
    interval = 30.0
    timeout = 10.0

    def __init__(self, hermes_home: Path, *, interval: float = 30.0) -> None:
        super().__init__()
        self.hermes_home = hermes_home
        self.interval = interval

    async def collect(self) -> dict[str, Any]:
        return await self.in_thread(read_home, self.hermes_home)


class HermesRouteWatcher(RouteProbeWatcher):
    """The route Hermes' runs use, probed into `model.route_key` (llm_watchdog reads
    `llm-route`); it closes its ChatClient with the engine's watchers."""

    name = "hermes-llm-route"

    async def aclose(self) -> None:
        await self.health.client.aclose()


def route_watcher(model: HermesModel, clock: Clock) -> HermesRouteWatcher | None:
    """The route probe for `model` (None without a `base_url` to probe)."""
    if model.base_url is None or model.model is None:
        return None
    client = ChatClient(model.base_url, model.model, model.api_key(),
                        timeout_s=model.probe_timeout_s)
    return HermesRouteWatcher(model.route_health(client, clock))
