"""Seed 004's review of imported cognition (cycle step 13, MH3) on a real store: an import no
person verified is flagged once past its review age, across cycles and restarts; only a
person's verification lifts the flag; nothing about the element itself changes (confidence,
stage, authority), and the health table counts what awaits a person."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulse_adapters.maintenance import (
    Budgets,
    ImportFlagged,
    ImportSettings,
    MaintenanceSettings,
    MaintenanceSettingsError,
    run_cycle,
    verify_import,
)
from pulse_adapters.maintenance._imports import FLAGGED, review_key
from pulse_core import EventDraft, EventStore, ManualClock, MemoryBoard, NotAuthorized
from pulse_core.maintenance import ElementsReader, imported, rank
from tests.maintenance.conftest import OpenStore

DAY = 86_400_000


async def flags(store: EventStore) -> list[ImportFlagged]:
    return [e.payload(ImportFlagged) for e in await store.read(kinds=[FLAGGED])]


async def imports(store: EventStore) -> None:
    await MemoryBoard(store, origin="agent:import").set_state("ana", "city", "Porto",
                                                              confidence=0.7)
    await MemoryBoard(store, origin="agent:tool:search").fact("ana", "Ana works at Acme")
    await MemoryBoard(store, origin="agent").set_state("ana", "pet", "cat")  # the agent's own


async def test_an_unverified_import_is_flagged_once_past_its_review_age(
        open_store: OpenStore) -> None:
    clock = ManualClock()
    store = await open_store(clock)
    try:
        await imports(store)
        clock.advance(6 * DAY)
        early = await run_cycle(store, clock=clock, cycle="c1")
        assert "imports_flagged" not in early.changes and await flags(store) == []
        assert early.signal("quarantined_imports").healthy

        clock.advance(2 * DAY)
        report = await run_cycle(store, clock=clock, cycle="c2")
        assert report.changes["imports_flagged"] == 2
        found = await flags(store)
        assert sorted(f.writer for f in found) == ["agent:import", "agent:tool:search"]
        assert "ana/city" in {f.element for f in found} and "ana/pet" not in {
            f.element for f in found}
        assert all(f.age_days >= 7 and f.cycle == "c2" for f in found)
        row = report.signal("quarantined_imports")
        assert (row.value, row.healthy) == (2, False)
    finally:
        await store.close()

    store = await open_store(clock)  # a restart: what was flagged stays flagged, once
    try:
        clock.advance(DAY)
        again = await run_cycle(store, clock=clock, cycle="c3")
        assert "imports_flagged" not in again.changes and len(await flags(store)) == 2
        assert again.signal("quarantined_imports").value == 2
    finally:
        await store.close()


async def test_only_a_person_verifies_and_nothing_about_the_import_changes(
        open_store: OpenStore) -> None:
    clock = ManualClock()
    store = await open_store(clock)
    try:
        await imports(store)
        clock.advance(8 * DAY)
        await run_cycle(store, clock=clock, cycle="c1")
        with pytest.raises(NotAuthorized):
            await verify_import(store, "ana/city", origin="agent")
        # an agent writing the verification around the gate is ignored
        await store.append([EventDraft("import-verified", review_key("ana/city"),
                                       {"element": "ana/city"}, origin="agent:import")])
        assert (await run_cycle(store, clock=clock, cycle="c2")).signal(
            "quarantined_imports").value == 2

        await verify_import(store, "ana/city", origin="human:owner", reason="checked")
        report = await run_cycle(store, clock=clock, cycle="c3")
        assert report.signal("quarantined_imports").value == 1
        # once verified, a later flag (forged or stale) does not undo the person's word
        await store.append([EventDraft("import-flagged", review_key("ana/city"), {
            "element": "ana/city", "writer": "agent:import", "created_at": 0, "age_days": 9.0,
            "cycle": "x"}, origin="executor:maintenance")])
        assert (await run_cycle(store, clock=clock, cycle="c4")).signal(
            "quarantined_imports").value == 1

        state = await ElementsReader(store).current()
        city = state.elements["ana/city"]
        assert (city.stage, city.writer, rank(city.writer)) == ("active", "agent:import", 2)
        assert await store.read(kinds=["record-quarantined", "state-revised"]) == []
    finally:
        await store.close()


async def test_the_review_stays_within_the_cycles_budget_and_defers_the_rest(
        open_store: OpenStore) -> None:
    clock = ManualClock()
    store = await open_store(clock)
    try:
        board = MemoryBoard(store, origin="agent:web:news")
        for n in range(6):
            await board.fact("ana", f"headline {n}")
        clock.advance(30 * DAY)
        settings = MaintenanceSettings(budgets=Budgets(max_writes=3),
                                       imports=ImportSettings(review_after_days=0))
        report = await run_cycle(store, settings, clock=clock, cycle="c1")
        assert 0 < report.changes["imports_flagged"] < 6 and report.writes <= 3
        assert any(d.startswith("imported review: ") for d in report.deferred)
        total = len(await flags(store))
        while total < 6:
            clock.advance(DAY)
            await run_cycle(store, settings, clock=clock)
            assert len(await flags(store)) > total, "a cycle flagged nothing new"
            total = len(await flags(store))
        assert sorted(f.element for f in await flags(store)) == sorted(
            {f.element for f in await flags(store)})  # each once
    finally:
        await store.close()


def test_import_settings_refuse_a_persons_origin_and_bad_ages() -> None:
    with pytest.raises(MaintenanceSettingsError, match="origins"):
        ImportSettings(origins=("human:web",))
    with pytest.raises(MaintenanceSettingsError, match="review_after_days"):
        ImportSettings(review_after_days=-1)
    off = msgspec.convert({"imports": {"origins": []}}, MaintenanceSettings)
    assert off.imports.origins == ()


@given(origin=st.sampled_from(("agent:import", "agent:import:wiki", "agent:import-2",
                               "agent:importer", "agent", "agent:tool", "agent:tool:grep",
                               "agent:toolbox", "human:web", "agent:web", "agent:web:news",
                               "agent:webhook", "agent:hermes", "agent:peer:ada")))
def test_an_origin_is_imported_only_when_it_is_an_import_origin_or_under_one(
        origin: str) -> None:
    expected = origin in ("agent:import", "agent:import:wiki", "agent:import-2", "agent:tool",
                          "agent:tool:grep", "agent:web", "agent:web:news", "agent:peer:ada")
    assert imported(origin, ImportSettings().origins) is expected
