"""The drill-down's JSON: a count of effects opens exactly the events it is made of (for each
effect, the event that put it in its state), a key's history gives each event with its
causes, and the fleet lists the engines writing the log."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from pulse_core import Engine, EventStore
from pulse_core._effects import effect_draft
from tests.web.conftest import ELSEWHERE, OrphanEffect
from tests.web.test_rules_api import ui_of


async def failed_by_the_loop(events: EventStore, keys: list[str]) -> None:
    for _ in range(400):
        failed = {e.key for e in await events.read(kinds=["effect-failed"])}
        if set(keys) <= failed:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the executor loop did not fail the effects no executor handles")


async def listed(http: httpx.AsyncClient, query: str) -> list[dict[str, Any]]:
    """Every event /api/events lists for `query`, following its `older` pages."""
    found: list[dict[str, Any]] = []
    before = ""
    while True:
        page = (await http.get(f"/api/events?{query}{before}")).json()
        found += page["events"]
        if page["older"] is None:
            return found
        before = f"&before={page['older']}"


async def test_each_count_of_effects_opens_exactly_the_events_it_is_made_of(
        tmp_path: Path) -> None:
    async with Engine(tmp_path / "home", executor_scan_interval=0.05) as engine:
        failed = [(await engine.append([effect_draft(OrphanEffect(note=str(n)), "agent")])
                   ).events[0].key for n in range(2)]
        pending = [(await engine.append([effect_draft(OrphanEffect(note=f"held {n}"), "agent",
                                                      host=ELSEWHERE)])).events[0].key
                   for n in range(3)]
        await failed_by_the_loop(engine.events, failed)
        async with ui_of(engine, has_directory=False) as http:
            counts = (await http.get("/api/overview")).json()["effects"]
            by_failed = await listed(http, "effects=failed")
            by_pending = await listed(http, "effects=pending&effects=retrying&limit=2")
            one_page = (await http.get("/api/events?effects=pending&limit=2")).json()
            acked = await http.get("/api/events?effects=acked")
            unknown = await http.get("/api/events?effects=lost")
            mixed = await http.get("/api/events?effects=failed&kind=effect")
    assert counts["failed"] == len(by_failed) == 2
    assert counts["pending"] + counts["retrying"] == len(by_pending) == 3
    assert {e["key"] for e in by_failed} == set(failed)
    assert {e["kind"] for e in by_failed} == {"effect-failed"}
    assert {e["key"] for e in by_pending} == set(pending)
    assert [e["seq"] for e in by_pending] == sorted((e["seq"] for e in by_pending),
                                                    reverse=True)
    assert len(one_page["events"]) == 2 and one_page["older"] is not None
    assert acked.status_code == 400 and "kind=effect-acked" in acked.json()["error"]
    assert unknown.status_code == 400 and "effects='lost'" in unknown.json()["error"]
    assert mixed.status_code == 400 and "no other filter" in mixed.json()["error"]


async def test_a_keys_history_gives_each_event_with_its_causes_and_centres_on_one(
        tmp_path: Path) -> None:
    async with Engine(tmp_path / "home", executor_scan_interval=0.05) as engine:
        started = (await engine.events.read(kinds=["engine-started"]))[-1]
        effect = (await engine.append([effect_draft(OrphanEffect(note="why"), "agent",
                                                    cause=started.seq)])).events[0]
        await failed_by_the_loop(engine.events, [effect.key])
        async with ui_of(engine, has_directory=False) as http:
            whole = (await http.get(f"/api/history?key={effect.key}")).json()
            centred = (await http.get(f"/api/history?key=engine&seq={started.seq}")).json()
            detail = (await http.get(f"/api/events/{whole['events'][-1]['seq']}")).json()
            no_key = await http.get("/api/history")
            bad_seq = await http.get("/api/history?key=engine&seq=x")
    kinds = [e["kind"] for e in whole["events"]]
    assert kinds == ["effect", "effect-executing", "effect-failed"]
    first, *later = whole["events"]
    assert [c["seq"] for c in first["causes"]] == [started.seq] and first["tick"] is None
    for event in later:  # an attempt's events lead back to the effect, then to its cause
        assert [c["seq"] for c in event["causes"]] == [effect.seq, started.seq]
    assert detail["causes"] == later[-1]["causes"]
    assert started.seq in [e["seq"] for e in centred["events"]]
    assert not whole["earlier"] and not whole["later"]
    assert no_key.status_code == 400 and bad_seq.status_code == 400


async def test_the_fleet_lists_the_running_engine_live_with_its_loops(tmp_path: Path) -> None:
    async with Engine(tmp_path / "home", heartbeat_s=0.1) as engine:
        owner = engine.executor_loop.owner
        async with ui_of(engine, has_directory=False) as http:
            for _ in range(200):
                engines = (await http.get("/api/fleet")).json()["engines"]
                if engines and engines[0]["loops"]:
                    break
                await asyncio.sleep(0.05)
            page = await http.get("/fleet")
    [mine] = engines
    assert (mine["owner"], mine["state"]) == (owner, "live")
    assert "heartbeat" in {loop["name"] for loop in mine["loops"]}
    assert page.status_code == 200 and "/static/fleet.js" in page.text
