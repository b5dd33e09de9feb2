"""Seed 004's SelfModel refresh (cycle step 11, MH1) on a real store: the summary of the self
identity's memory merges duplicates, drops what is archived or superseded, notes
contradictions, keeps unverified imports out, stays within its bound, and is written again
only when it changed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_adapters.maintenance import (
    SELF_MODEL,
    Budgets,
    MaintenanceSettings,
    SelfModel,
    SelfModelSettings,
    render_self_model,
    run_cycle,
    self_model_summary,
    session_primer,
    verify_import,
)
from pulse_adapters.maintenance._imports import FLAGGED, imported_review
from pulse_adapters.maintenance._self_model import self_model, summarize
from pulse_core import (
    EventDraft,
    EventStore,
    ManualClock,
    MemoryBoard,
    PersistentMap,
    open_home,
)
from pulse_core.maintenance import (
    AGENT,
    BACKGROUND,
    HUMAN,
    Authority,
    Element,
    ElementsReader,
    ElementsState,
    RetentionLadder,
    read_activity,
)
from pulse_core.memory import IdentityMemory, Note, StateItem, identity_key
from pulse_core.store import is_sealed
from tests.maintenance.conftest import OpenStore

DAY = 86_400_000


async def refreshed(store: EventStore) -> list[SelfModel]:
    return [e.payload(SelfModel) for e in await store.read(kinds=[SELF_MODEL])]


async def test_the_summary_merges_duplicates_drops_what_no_longer_holds_and_notes_conflicts(
        open_store: OpenStore) -> None:
    clock = ManualClock()
    store = await open_store(clock)
    try:
        board = MemoryBoard(store)
        await board.set_state("self", "preference:tone", "concise")
        await board.set_state("self", "preference:Tone", "verbose")  # one name, two texts
        await board.set_state("self", "capability:python", "strong")
        await board.set_state("self", "capability:cobol", "none")
        await board.fact("self", "I run on a Raspberry Pi")
        await board.fact("self", "  i run on a raspberry PI. ")  # the same, said again
        await board.fact("self", "I am in beta", valid_until=clock.now_ms() - 1)  # superseded
        await board.set_state("ana", "city", "Lisbon")  # another identity: not the self
        await board.set_state("self", "permission:purge", "granted")  # a claim, not a grant
        await store.append([EventDraft("element-archived", identity_key("self"),
                                       {"record": "capability:cobol"}, origin="human")])
        report = await run_cycle(store, clock=clock, cycle="c1")
        assert report.changes["self_model_refreshed"] == 1 and report.warnings == ()
        (body,) = await refreshed(store)
        assert (body.identity, body.cycle, body.total, body.merged, body.dropped) == (
            "self", "c1", 4, 1, 2)
        assert body.authority_claims == 1
        pi = next(e for e in body.entries if e.category == "fact")
        assert pi.support == 2 and len(pi.merged) == 1
        refresh = await read_activity(store, f"self-model:c1:{body.basis_seq}")
        assert refresh is not None and refresh.activity_class == "self_model_refresh"
        assert set(refresh.inputs) == {i for e in body.entries for i in (e.id, *e.merged)}
        assert refresh.outputs == ("self-model:self",)
        assert {(e.category, e.name) for e in body.entries} == {
            ("preference", "tone"), ("preference", "Tone"), ("capability", "python"),
            ("fact", "")}
        assert body.contradictions == ("self/preference:tone",)
        assert all((e.by, e.authority) == ("agent", AGENT) for e in body.entries)
        text = render_self_model(body, store.keys)
        assert "(said 2 times)" in text and "cobol" not in text and "beta" not in text
        assert "Contradictions (unresolved): self/preference:tone" in text
        assert "purge" not in text
        primer = await self_model_summary(store)
        assert primer is not None and primer.startswith("Self-model of 'self' as of event #")

        again = await run_cycle(store, clock=clock, cycle="c2")
        assert "self_model_refreshed" not in again.changes  # unchanged: not rewritten
        await board.write("self", "state-retracted", {"record": "preference:Tone"})
        third = await run_cycle(store, clock=clock, cycle="c3")
        assert third.changes["self_model_refreshed"] == 1
        newest = (await refreshed(store))[-1]
        assert newest.contradictions == () and newest.total == 3
    finally:
        await store.close()


async def test_nothing_is_written_while_the_self_holds_nothing(open_store: OpenStore) -> None:
    store = await open_store()
    try:
        await MemoryBoard(store).set_state("ana", "city", "Lisbon")
        report = await run_cycle(store, cycle="c1")
        assert "self_model_refreshed" not in report.changes
        assert await self_model_summary(store) is None
    finally:
        await store.close()


async def test_another_self_identity_gets_a_summary_of_its_own_even_when_both_are_empty(
        open_store: OpenStore) -> None:
    store = await open_store()
    try:
        for who in ("self", "me"):  # each holds one archived entry: alike but for the name
            await MemoryBoard(store).set_state(who, "trait:calm", "yes")
            await store.append([EventDraft("element-archived", identity_key(who),
                                           {"record": "trait:calm"}, origin="human")])
        await run_cycle(store, cycle="c1")
        settings = MaintenanceSettings(self_model=SelfModelSettings(identity="me"))
        await run_cycle(store, settings, cycle="c2")
        assert [(b.identity, b.total) for b in await refreshed(store)] == [("self", 0),
                                                                           ("me", 0)]
    finally:
        await store.close()


async def test_the_summary_keeps_at_most_max_entries_and_says_how_many_more(
        open_store: OpenStore) -> None:
    clock = ManualClock()
    store = await open_store(clock)
    try:
        board = MemoryBoard(store)
        for n in range(12):
            await board.set_state("me", f"trait:t{n}", f"value {n}")
            clock.advance(1)
        settings = MaintenanceSettings(self_model=SelfModelSettings(identity="me",
                                                                    max_entries=5))
        await run_cycle(store, settings, clock=clock, cycle="c1")
        (body,) = await refreshed(store)
        assert (len(body.entries), body.total, body.identity) == (5, 12, "me")
        assert [e.name for e in body.entries] == [f"t{n}" for n in (11, 10, 9, 8, 7)]  # newest
        assert render_self_model(body, store.keys).endswith("... and 7 more")
    finally:
        await store.close()


async def test_an_import_stays_out_until_a_person_verifies_it_and_never_gains_authority(
        open_store: OpenStore) -> None:
    store = await open_store()
    try:
        await MemoryBoard(store, origin="agent").set_state("self", "capability:python", "ok")
        await MemoryBoard(store, origin="agent:import").set_state(
            "self", "capability:rust", "expert")
        await run_cycle(store, cycle="c1")
        (body,) = await refreshed(store)
        assert [e.name for e in body.entries] == ["python"] and body.unverified_imports == 1

        await verify_import(store, "self/capability:rust", origin="human:owner")
        await run_cycle(store, cycle="c2")
        body = (await refreshed(store))[-1]
        rust = next(e for e in body.entries if e.name == "rust")
        assert (rust.by, rust.authority, body.unverified_imports) == (
            "agent:import", BACKGROUND, 0)
        assert [e.name for e in body.entries] == ["python", "rust"]  # the agent's own first
    finally:
        await store.close()


# -- the summary as a pure function: its bound and the authority of imports ---------------

ORIGINS = ("agent", "agent:import", "agent:tool:search", "human", "executor:awareness")
RECORDS = st.lists(st.tuples(st.sampled_from(("trait", "preference", "fact", "Permission")),
                             st.sampled_from(("a", "b", "c", "d")),
                             st.sampled_from(("yes", "Yes ", "no", "maybe")),
                             st.sampled_from(ORIGINS), st.booleans(),
                             st.sampled_from(("active", "archived", "tombstoned"))),
                   max_size=25)


def memory_of(records: list[tuple[str, str, str, str, bool, str]]
              ) -> tuple[IdentityMemory, ElementsState, set[str]]:
    state: dict[str, StateItem] = {}
    facts: dict[str, Note] = {}
    elements: PersistentMap[str, Element] = PersistentMap()
    verified: set[str] = set()
    for n, (category, name, text, origin, checked, stage) in enumerate(records):
        record = f"f-{n}" if category == "fact" else f"{category}:{name}{n % 3}"
        if category == "fact":
            facts[record] = Note(record, text, n)
        else:
            state[record] = StateItem(record, text, 1.0, False, (), n, origin)
        elements = elements.set(f"self/{record}", Element(
            id=f"self/{record}", identity="self", record=record,
            type="fact" if category == "fact" else "state", created_at=n, created_seq=n + 1,
            writer=origin, stage=stage))
        if checked:
            verified.add(f"self/{record}")
    return (IdentityMemory(identity="self", state=state, facts=facts),
            ElementsState(elements=elements), verified)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=RECORDS, bound=st.integers(1, 6))
def test_the_summary_never_exceeds_its_bound_and_an_import_never_outranks_background(
        records: list[tuple[str, str, str, str, bool, str]], bound: int) -> None:
    memory, elements, verified = memory_of(records)
    imports = ("agent:import", "agent:tool")
    found = summarize(memory, elements, now=10**6, opened=str, max_entries=bound,
                      import_origins=imports, verified=verified)
    assert len(found.entries) <= bound and found.total >= len(found.entries)
    listed = len(memory.state) + len(memory.facts)
    assert found.total + found.merged + found.dropped + found.unverified_imports \
        + found.authority_claims == listed
    for entry in found.entries:
        assert elements.elements[entry.id].stage == "active"
        assert entry.category != "Permission"
        from_outside = entry.by in ("agent:import", "agent:tool:search")
        assert entry.authority == (BACKGROUND if from_outside else
                                   {"agent": AGENT, "human": HUMAN}.get(entry.by, BACKGROUND))
        assert not from_outside or entry.id in verified
        assert all(m not in {e.id for e in found.entries} for m in entry.merged)


async def test_a_refresh_that_does_not_fit_the_budget_is_deferred(open_store: OpenStore) -> None:
    store = await open_store()
    try:
        await MemoryBoard(store).set_state("self", "trait:calm", "yes")
        settings = MaintenanceSettings(budgets=Budgets(max_writes=1))
        report = await run_cycle(store, settings, cycle="c1")
        assert report.writes <= 1 and "self-model: not refreshed (budget)" in report.deferred
        assert await refreshed(store) == []
    finally:
        await store.close()


async def test_a_cycle_cut_short_after_both_steps_resumes_without_writing_them_twice(
        open_store: OpenStore) -> None:
    clock = ManualClock()
    store = await open_store(clock)
    try:
        await MemoryBoard(store).set_state("self", "trait:calm", "yes")
        await MemoryBoard(store, origin="agent:import").fact("self", "I was built in 2020")
        clock.advance(8 * DAY)

        async def killed(run: object) -> None:
            raise asyncio.CancelledError  # the engine died here: the cycle stays running

        with pytest.raises(asyncio.CancelledError):
            await run_cycle(store, clock=clock, cycle="night-1", steps=[
                ("self_model", self_model), ("imported_review", imported_review),
                ("killed", killed)])
        assert len(await refreshed(store)) == 1 and len(await store.read(kinds=[FLAGGED])) == 1
        await store.close()
        store = await open_store(clock)  # and restarted
        report = await run_cycle(store, clock=clock, cycle="night-1")
        assert report.status == "completed"
        assert (report.changes["self_model_refreshed"], report.changes["imports_flagged"]) == (
            1, 1)  # the first attempt's, counted from the log; none written again
        assert len(await refreshed(store)) == 1 and len(await store.read(kinds=[FLAGGED])) == 1
    finally:
        await store.close()


async def test_the_summary_holds_sealed_text_that_a_purge_makes_unreadable(
        tmp_path: Path) -> None:
    stores = await open_home(tmp_path / "home")
    store = stores.events
    try:
        await MemoryBoard(store).set_state("self", "trait:secret", "afraid of the dark")
        await run_cycle(store, cycle="c1")
        (body,) = await refreshed(store)
        assert is_sealed(body.entries[0].text) and "dark" not in body.entries[0].text
        assert "- secret: afraid of the dark [agent]" in (await self_model_summary(store) or "")
        ladder = RetentionLadder(store, ElementsReader(store), Authority(
            store, standing={"privacy": ("archive", "purge")}), "privacy", origin="human:me")
        await ladder.archive("self/trait:secret")
        await ladder.purge("self/trait:secret", confirm="self/trait:secret")
        assert "afraid" not in render_self_model(body, store.keys)  # the old summary too
        await run_cycle(store, cycle="c2")
        assert "secret" not in (await self_model_summary(store) or "")
    finally:
        await stores.close()


async def test_the_session_primer_holds_the_working_state_then_the_self_model_within_bound(
        open_store: OpenStore) -> None:
    clock = ManualClock()
    store = await open_store(clock)
    try:
        board = MemoryBoard(store)
        await board.set_state("self", "preference:tone", "concise")
        await store.append([
            EventDraft("identity-registered", identity_key("ana"), {"name": "Ana"},
                       origin="agent"),
            EventDraft("commitment-made", identity_key("ana"),
                       {"record": "c1", "text": "send Ana the report",
                        "due_at": clock.now_ms() + DAY}, origin="agent")])
        await run_cycle(store, clock=clock, cycle="c1")
        primer = await session_primer(store)
        short = await session_primer(store, max_chars=120)
    finally:
        await store.close()
    assert primer is not None and short is not None
    working, self_part = primer.split("\n\nSelf-model of 'self'")
    assert working.startswith("Working state as of event #")
    assert "- send Ana the report" in working
    assert "tone: concise" in self_part
    assert len(short) <= 120 and short.endswith(" ...")
