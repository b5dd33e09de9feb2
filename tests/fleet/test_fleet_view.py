"""The fleet view of a shared log: two engines in processes of their own (each standing in
for a host) on one store, SQLite or PostgreSQL, each shown by `upulse fleet` from a third
home reading that store, with its own lease and last tick; one SIGKILLed is shown stale once
its heartbeats are overdue, never live, while the other stays live."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pulse_core.store import open_event_store
from tests.cli.runner import Upulse
from tests.e2e.support import Child
from tests.fleet.fleet_support import append_work, ready
from tests.timing import scaled

TEST_TIME_LIMIT_S = 90
HEARTBEAT_S = 1.0




def fleet(upulse: Upulse, reader: Path) -> dict[str, dict[str, Any]]:
    """`upulse fleet --json` of the reader's home, by host."""
    found = upulse.json("fleet", "--home", reader)
    assert isinstance(found, dict)
    return {e["host"]: e for e in found["engines"] if e["state"] != "stopped"}


def wait_fleet(upulse: Upulse, reader: Path, probe: Callable[[dict[str, dict[str, Any]]], bool],
               what: str, within: float = 30.0) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + scaled(within)
    while True:
        found = fleet(upulse, reader)
        if probe(found):
            return found
        assert time.monotonic() < deadline, f"{what}: the fleet shows {found}"
        time.sleep(0.2)


def test_two_engines_show_their_own_lease_and_tick_and_a_killed_one_goes_stale(
        tmp_path: Path, store_url: str, spawn_host: Callable[..., Child]) -> None:
    options = ("--concurrency", "1", "--first-attempt-seconds", "60", "--timeout", "60",
               "--heartbeat-seconds", str(HEARTBEAT_S))
    red, blue = spawn_host("red", store_url, *options), spawn_host("blue", store_url, *options)
    asyncio.run(ready(red, blue))

    async def two_effects() -> None:
        store = await open_event_store(store_url)
        try:
            await append_work(store, 2)
        finally:
            await store.close()

    asyncio.run(two_effects())
    upulse = Upulse(tmp_path)
    reader = tmp_path / "reader"
    upulse("init", "--home", reader, "--store", store_url)
    both = wait_fleet(upulse, reader, lambda f: {"red", "blue"} <= set(f) and all(
        f[h]["state"] == "live" and len(f[h]["leases"]) == 1 and f[h]["tick"]
        and f[h]["last_tick_at"] for h in ("red", "blue")),
        "both engines live, each with its claim and a tick")
    assert both["red"]["leases"][0]["effect_id"] != both["blue"]["leases"][0]["effect_id"]
    assert both["red"]["owner"] != both["blue"]["owner"]
    assert {"tick", "executors", "heartbeat"} <= {loop["name"] for loop in both["red"]["loops"]}
    assert both["red"]["pid"] == red.pid and both["blue"]["pid"] == blue.pid

    red.kill()
    after = wait_fleet(upulse, reader, lambda f: f["red"]["state"] != "live",
                       "the killed engine to be no longer live")
    assert after["red"]["state"] == "stale"
    assert after["red"]["leases"] == both["red"]["leases"]  # its claim is still its own
    # the live one is judged by its heartbeats too: waited for, as a loaded machine may
    # delay one
    seen = wait_fleet(upulse, reader, lambda f: f["blue"]["state"] == "live",
                      "the other engine to be live")
    assert seen["blue"]["leases"] == both["blue"]["leases"] and seen["red"]["state"] == "stale"
    table = upulse("fleet", "--home", reader).stdout
    assert "stale" in table and "live" in table and "blue" in table
