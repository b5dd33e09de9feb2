"""The Memory API over real MemoryBoard events: every identity with its record counts and
newest exchange, one identity's records with who wrote each, forgotten records shown only as
removals, bounded lists with whole counts, and unknown identities or bad bounds answered
with what to do. One test goes through the real uvicorn server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from pulse_adapters.web import layer
from pulse_core import Engine, LayerContext, MemoryBoard, SystemClock
from tests.web.test_rules_api import served, ui_of, until


async def test_over_http_identities_list_their_counts_and_records_name_who_wrote_them(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    web = layer({"port": 0, "live_every_s": 0.2}, LayerContext(home, SystemClock()))
    async with Engine(home, layers=[web]) as engine:
        board = MemoryBoard(engine.events)
        await board.register("ada", "Ada")
        await board.set_state("ada", "mood", "calm", confidence=0.7)
        await board.exchange("ada", "hello there")
        await MemoryBoard(engine.events, origin="agent:openclaw").exchange(
            "ada", "hello Ada", role="agent")
        await board.register("bob", "Bob")
        url, token = await served(home)
        async with httpx.AsyncClient(headers=token, timeout=30) as http:
            async def both() -> dict[str, Any] | None:
                found = (await http.get(url + "api/memory")).json()
                return found if len(found["identities"]) == 2 else None

            listing = await until(both, "both identities on the page")
            ada = (await http.get(url + "api/memory/ada")).json()
            missing = await http.get(url + "api/memory/nobody")
            bad = await http.get(url + "api/memory/ada?shown=lots")
            refused = await http.get(url + "api/memory", headers={"authorization": "Bearer x"})
    first, second = listing["identities"]
    assert (first["identity"], first["name"], second["identity"]) == ("ada", "Ada", "bob")
    assert first["counts"]["exchanges"] == 2 and first["counts"]["state"] == 1
    assert first["last_exchange"]["text"] == "hello Ada"
    assert first["last_exchange"]["role"] == "agent"
    assert second["last_exchange"] is None
    assert "human-exchange" in listing["kinds"]
    assert [(x["text"], x["by"]) for x in ada["exchanges"]] == [
        ("hello Ada", "agent:openclaw"), ("hello there", "human")]
    (mood,) = ada["state"]
    assert (mood["item"], mood["value"], mood["confidence"], mood["set_by"]) == \
        ("mood", "calm", 0.7, "agent")
    assert missing.status_code == 404 and "/api/memory" in missing.json()["error"]
    assert bad.status_code == 400 and "shown" in bad.json()["error"]
    assert refused.status_code in (401, 403)


async def test_a_forgotten_record_shows_as_a_removal_without_its_content(
        tmp_path: Path) -> None:
    async with Engine(tmp_path / "home") as engine, ui_of(engine, has_directory=False) as http:
        board = MemoryBoard(engine.events)
        await board.register("ada", "Ada")
        secret = await board.exchange("ada", "my locker code is 4711")
        await board.exchange("ada", "see you")
        await board.forget("ada", str(secret.data["record"]), reason="she asked to forget it")
        answer = await http.get("/api/memory/ada")
        listing = (await http.get("/api/memory")).json()
    assert answer.status_code == 200
    assert "4711" not in answer.text and "4711" not in str(listing)
    records = answer.json()
    assert [x["text"] for x in records["exchanges"]] == ["see you"]
    (removed,) = records["removed"]
    assert removed["record"] == secret.data["record"] and removed["was"] == "exchange"
    assert removed["how"] == "forgotten" and removed["reason"] == "she asked to forget it"
    assert listing["identities"][0]["counts"]["removed"] == 1


async def test_shown_bounds_the_listed_records_while_the_counts_stay_whole(
        tmp_path: Path) -> None:
    async with Engine(tmp_path / "home") as engine, ui_of(engine, has_directory=False) as http:
        board = MemoryBoard(engine.events)
        for n in range(5):
            await board.exchange("ada", f"message {n}")
        two = (await http.get("/api/memory/ada?shown=2")).json()
        too_many = await http.get("/api/memory/ada?shown=100000")
    assert [x["text"] for x in two["exchanges"]] == ["message 4", "message 3"]
    assert two["counts"]["exchanges"] == 5
    assert too_many.status_code == 400 and "0 to 500" in too_many.json()["error"]
