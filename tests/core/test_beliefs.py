"""Beliefs: assertions per identity and slot, where disagreement is kept, not overwritten."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_core import InvalidEvent, MemoryBoard, Projector, SqliteEventStore, identity_key
from pulse_core._events import Event, EventDraft
from pulse_core._pmap import PersistentMap
from pulse_core.maintenance._beliefs import (
    Assertion,
    AssertionClosed,
    AssertionMade,
    BeliefBoard,
    Beliefs,
    IdentityBeliefs,
    RevisionRefused,
    believe,
    classify,
    contested,
)

ANA = "ana"


async def _beliefs(store: SqliteEventStore) -> PersistentMap[str, IdentityBeliefs]:
    state: PersistentMap[str, IdentityBeliefs] = (
        await Projector(store, [Beliefs()]).catch_up())["beliefs"]
    return state


async def test_two_actors_assertions_both_stay_active_and_the_slot_is_contested(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = BeliefBoard(store)
    lisbon = await board.assert_(ANA, "timezone", "Europe/Lisbon", confidence=0.9)
    berlin = await board.assert_(ANA, "timezone", "Europe/Berlin", confidence=0.6,
                                 mode="inferred", origin="executor:maintenance")
    ana = (await _beliefs(store))[ANA]
    slot = ana.slots["timezone"]
    assert [a.record for a in slot] == [lisbon.data["record"], berlin.data["record"]]
    assert [a.status for a in slot] == ["active", "active"]
    assert [a.actor for a in slot] == ["agent", "executor:maintenance"]
    assert [a.confidence for a in slot] == [0.9, 0.6]
    assert slot[1].mode == "inferred" and slot[1].id == f"{ANA}/{berlin.data['record']}"
    assert ana.active("timezone") == slot
    assert classify(slot[0], slot[1]) == "different-actors"
    assert contested(await _beliefs(store)) == [(ANA, "timezone")]
    await store.close()


async def test_an_actor_revising_its_own_claim_supersedes_only_that_claim(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = BeliefBoard(store)
    wrong = await board.assert_(ANA, "timezone", "Europe/Lisbon")
    other = await board.assert_(ANA, "timezone", "Europe/Paris", origin="human:ana")
    right = await board.assert_(ANA, "timezone", "Europe/Berlin",
                                supersedes=wrong.data["record"], reason="misread the city")
    ana = (await _beliefs(store))[ANA]
    old = ana.assertion(wrong.data["record"])
    new = ana.assertion(right.data["record"])
    human = ana.assertion(other.data["record"])
    assert old is not None and new is not None and human is not None
    assert (old.status, old.superseded_by) == ("superseded", right.data["record"])
    assert (new.status, new.supersedes) == ("active", wrong.data["record"])
    assert human.status == "active"
    assert old.confidence == 1.0 and old.value == "Europe/Lisbon"  # kept, as written
    assert classify(old, new) == classify(new, old) == "same-actor-revision"
    assert contested(await _beliefs(store)) == [(ANA, "timezone")]  # the human still disagrees
    await board.assert_(ANA, "timezone", "Europe/Paris", supersedes=right.data["record"])
    assert contested(await _beliefs(store)) == []  # only the superseded claims disagree now
    await store.close()


async def test_superseding_another_actors_assertion_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = BeliefBoard(store)
    human = await board.assert_(ANA, "city", "Lisbon", origin="human:ana")
    before = await store.last_seq()
    with pytest.raises(RevisionRefused, match="made by 'human:ana', not 'agent'") as caught:
        await board.assert_(ANA, "city", "Porto", supersedes=human.data["record"])
    assert (caught.value.identity, caught.value.record) == (ANA, human.data["record"])
    assert await store.last_seq() == before
    assert (await _beliefs(store))[ANA].slots["city"][0].status == "active"
    await store.close()


@pytest.mark.parametrize("case", ["unknown", "other-slot", "already-superseded"])
async def test_a_revision_of_an_unknown_other_slot_or_superseded_claim_is_refused(
    tmp_path: Path, case: str,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = BeliefBoard(store)
    first = await board.assert_(ANA, "city", "Lisbon")
    target, slot, words = "a-nothing", "city", "has no assertion"
    if case == "other-slot":
        target, slot, words = first.data["record"], "timezone", "is about slot 'city'"
    elif case == "already-superseded":
        await board.assert_(ANA, "city", "Porto", supersedes=first.data["record"])
        target, words = first.data["record"], "already superseded"
    before = await store.last_seq()
    with pytest.raises(RevisionRefused, match=words):
        await board.assert_(ANA, slot, "Faro", supersedes=target)
    assert await store.last_seq() == before
    await store.close()


async def test_the_fold_ignores_a_supersession_of_another_actors_claim_written_past_the_board(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = BeliefBoard(store)
    human = await board.assert_(ANA, "city", "Lisbon", origin="human:ana")
    body = AssertionMade(record="a-forged", slot="city", value="Porto",
                         supersedes=human.data["record"])
    await store.append([EventDraft("assertion-made", identity_key(ANA),
                                   msgspec.to_builtins(body), origin="executor:maintenance")])
    ana = (await _beliefs(store))[ANA]
    kept, forged = ana.slots["city"]
    assert (kept.status, kept.superseded_by) == ("active", None)
    assert (forged.status, forged.supersedes, forged.ignored_supersedes) == (
        "active", None, human.data["record"])
    assert contested(await _beliefs(store)) == [(ANA, "city")]
    await store.close()


async def test_closing_a_claim_sets_valid_until_and_never_supersedes_it(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = BeliefBoard(store)
    lisbon = await board.assert_(ANA, "city", "Lisbon", confidence=0.8, valid_from=100)
    await board.close(ANA, lisbon.data["record"], 500, reason="she moved")
    berlin = await board.assert_(ANA, "city", "Berlin", valid_from=500)
    ana = (await _beliefs(store))[ANA]
    closed = ana.assertion(lisbon.data["record"])
    now = ana.assertion(berlin.data["record"])
    assert closed is not None and now is not None
    assert (closed.status, closed.valid_until, closed.superseded_by) == ("closed", 500, None)
    assert closed.confidence == 0.8 and closed.closed_reason == "she moved"
    assert classify(closed, now) == "different-valid-times"
    assert ana.active("city") == (now,)
    assert contested(await _beliefs(store)) == []
    await store.close()


@pytest.mark.parametrize("case", ["other-actor", "twice", "before-valid-from", "superseded"])
async def test_a_close_the_actor_may_not_make_is_refused_and_ignored_by_the_fold(
    tmp_path: Path, case: str,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = BeliefBoard(store)
    claim = (await board.assert_(ANA, "city", "Lisbon", valid_from=100)).data["record"]
    origin, until, words = "agent", 300, ""
    if case == "other-actor":
        origin, words = "human:ana", "made by 'agent'"
    elif case == "twice":
        await board.close(ANA, claim, 200)
        words = "already closed at 200"
    elif case == "before-valid-from":
        until, words = 50, "before assertion"
    else:
        await board.assert_(ANA, "city", "Porto", supersedes=claim)
        words = "already superseded"
    before = await store.last_seq()
    with pytest.raises(RevisionRefused, match=words):
        await board.close(ANA, claim, until, origin=origin)
    assert await store.last_seq() == before
    expected = (await _beliefs(store))[ANA].assertion(claim)
    draft = EventDraft("assertion-closed", identity_key(ANA), msgspec.to_builtins(
        AssertionClosed(record=claim, valid_until=until)), origin=origin)
    await store.append([draft])  # written past the board: the fold ignores it
    assert (await _beliefs(store))[ANA].assertion(claim) == expected
    await store.close()


async def test_a_malformed_assertion_is_refused_by_the_catalogue(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = BeliefBoard(store)
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        await board.assert_(ANA, "city", "Lisbon", confidence=1.5)
    with pytest.raises(ValueError, match="mode 'guessed'"):
        await board.assert_(ANA, "city", "Lisbon", mode="guessed")
    with pytest.raises(ValueError, match="not an element id"):
        await board.assert_(ANA, "city", "Lisbon", evidence=("x-123",))
    with pytest.raises(ValueError, match="before valid_from"):
        await board.assert_(ANA, "city", "Lisbon", valid_from=10, valid_until=5)
    bad = {"record": "x-1", "slot": "city", "value": "Lisbon"}
    with pytest.raises(InvalidEvent, match="must start with 'a-'"):
        await store.append([EventDraft("assertion-made", identity_key(ANA), bad)])
    assert await store.last_seq() == 0
    await store.close()


def _assertion(record: str, value: Any, actor: str = "agent", *, valid: tuple[int | None,
               int | None] = (None, None), evidence: tuple[str, ...] = (),
               supersedes: str | None = None) -> Assertion:
    return Assertion(record, ANA, "city", value, 1.0, "stated", actor, 0, 0, valid[0], valid[1],
                     evidence, supersedes)


def test_classify_names_each_class_in_its_order() -> None:
    a = _assertion("a-1", "Lisbon", evidence=("ana/x-1",))
    assert classify(a, _assertion("a-2", "Porto", supersedes="a-1")) == "same-actor-revision"
    assert classify(a, _assertion("a-2", "Lisbon", "human")) == "agreement"
    assert classify(a, _assertion("a-2", "Porto", "human")) == "different-actors"
    assert classify(a, _assertion("a-2", "Porto")) == "same-actor-revision"  # changed its mind
    early = _assertion("a-3", "Lisbon", valid=(0, 100))
    late = _assertion("a-4", "Berlin", "human", valid=(100, None))
    assert classify(early, late) == "different-valid-times"
    assert classify(late, early) == "different-valid-times"
    assert classify(early, _assertion("a-5", "Berlin", "human", valid=(99, None))) == \
        "different-actors"
    corrected = {"ana/x-1"}
    assert classify(a, _assertion("a-6", "Porto", "human", evidence=("ana/x-2",)),
                    corrected) == "source-correction"
    assert classify(a, _assertion("a-6", "Porto", "human", evidence=("ana/x-1",)),
                    corrected) == "different-actors"  # both rest on the corrected source
    with pytest.raises(ValueError, match="one slot"):
        classify(a, msgspec.structs.replace(a, slot="timezone"))


async def test_a_disagreement_explained_by_a_corrected_source_is_not_contested(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    memory = MemoryBoard(store)
    heard = (await memory.exchange(ANA, "I live in Porto")).data["record"]
    fixed = (await memory.exchange(ANA, "sorry, Lisbon, not Porto")).data["record"]
    board = BeliefBoard(store)
    await board.assert_(ANA, "city", "Porto", evidence=(f"{ANA}/{heard}",))
    await board.assert_(ANA, "city", "Lisbon", evidence=(f"{ANA}/{fixed}",), origin="human")
    state = await _beliefs(store)
    assert contested(state) == [(ANA, "city")]
    assert contested(state, corrected={f"{ANA}/{heard}"}) == []
    await store.close()


async def test_a_forgotten_assertion_leaves_its_slot_and_its_id_never_comes_back(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = BeliefBoard(store)
    gone = (await board.assert_(ANA, "city", "Lisbon")).data["record"]
    await board.assert_(ANA, "city", "Porto", origin="human")
    await MemoryBoard(store).forget(ANA, gone, "asked to forget")
    await MemoryBoard(store).forget("bob", "x-1", "not a belief")
    await MemoryBoard(store).forget("zoe", "a-early", "forgotten before it was imported")
    early = AssertionMade(record="a-early", slot="city", value="Faro")
    await store.append([EventDraft("assertion-made", identity_key("zoe"),
                                   msgspec.to_builtins(early))])
    again = AssertionMade(record=gone, slot="city", value="Lisbon")
    await store.append([EventDraft("assertion-made", identity_key(ANA),
                                   msgspec.to_builtins(again))])
    state = await _beliefs(store)
    assert "bob" not in state  # forgetting other records makes no beliefs
    assert state["zoe"].slots == {} and state["zoe"].removed == {"a-early"}
    ana = state[ANA]
    assert [a.value for a in ana.slots["city"]] == ["Porto"]
    assert gone in ana.removed and ana.assertion(gone) is None
    with pytest.raises(RevisionRefused, match="has no assertion"):
        await board.assert_(ANA, "city", "Faro", supersedes=gone)
    await store.close()


async def test_a_replayed_or_reimported_assertion_creates_no_second_claim(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    made = await BeliefBoard(store).assert_(ANA, "city", "Lisbon", confidence=0.7)
    copy = EventDraft("assertion-made", identity_key(ANA), made.data, origin="human")
    await store.append([copy])  # the same record again (a duplicate import), by anyone
    ana = (await _beliefs(store))[ANA]
    assert [(a.record, a.actor, a.confidence) for a in ana.slots["city"]] == [
        (made.data["record"], "agent", 0.7)]
    await store.close()


async def test_beliefs_survive_a_checkpointed_restart(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = BeliefBoard(store)
    first = await board.assert_(ANA, "city", "Lisbon", valid_from=1, evidence=("ana/x-1",))
    await board.assert_(ANA, "city", "Porto", supersedes=first.data["record"])
    await board.assert_("bob", "pets", ["cat", {"name": "Miso"}], origin="human")
    ckpt = tmp_path / "ckpt"
    projector = Projector(store, [Beliefs()], checkpoints=ckpt, checkpoint_every=1)
    await projector.catch_up()
    await projector.checkpoint()
    resumed = await Projector(store, [Beliefs()], checkpoints=ckpt).catch_up()
    replayed = await Projector(store, [Beliefs()]).catch_up()
    assert resumed == replayed
    assert resumed["beliefs"]["ana"].slots["city"][0].status == "superseded"
    await store.close()


async def test_two_concurrent_revisions_of_one_claim_let_exactly_one_through(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = BeliefBoard(store)
    claim = (await board.assert_(ANA, "city", "Lisbon")).data["record"]
    outcomes = await asyncio.gather(
        board.assert_(ANA, "city", "Porto", supersedes=claim),
        board.assert_(ANA, "city", "Faro", supersedes=claim), return_exceptions=True)
    assert sorted(type(o).__name__ for o in outcomes) == ["Event", "RevisionRefused"]
    ana = (await _beliefs(store))[ANA]
    assert len(ana.slots["city"]) == 2
    await store.close()


ACTORS = ("agent", "human:ana", "executor:maintenance")
_op = st.tuples(st.sampled_from(["assert", "revise", "close"]), st.sampled_from(ACTORS),
                st.integers(0, 30), st.sampled_from(["Lisbon", "Porto", "Faro"]))


def _event(seq: int, kind: str, origin: str, data: dict[str, Any]) -> Event:
    return Event(seq, f"e{seq}", kind, identity_key(ANA), seq, seq, origin, None, "t", None,
                 data, None)


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=40))
def test_any_interleaving_by_several_actors_never_supersedes_another_actors_claim(
    ops: list[tuple[str, str, int, str]],
) -> None:
    beliefs: IdentityBeliefs | None = None
    written: dict[str, tuple[str, float]] = {}
    for seq, (op, actor, pick, value) in enumerate(ops, start=1):
        target = sorted(written)[pick % len(written)] if written else "a-none"
        if op == "close":
            event = _event(seq, "assertion-closed", actor, {"record": target,
                                                            "valid_until": seq})
        else:
            record, confidence = f"a-{seq:03}", (pick % 10) / 10
            written[record] = (actor, confidence)
            event = _event(seq, "assertion-made", actor, {
                "record": record, "slot": "city", "value": value, "confidence": confidence,
                "supersedes": target if op == "revise" else None})
        beliefs = believe(beliefs, event)
    held = {a.record: a for a in (beliefs.slots.get("city", ()) if beliefs else ())}
    assert set(held) == set(written)  # nothing dropped, for any contradiction
    for record, assertion in held.items():
        assert (assertion.actor, assertion.confidence) == written[record]
        if assertion.superseded_by is not None:
            assert held[assertion.superseded_by].actor == assertion.actor
            assert held[assertion.superseded_by].supersedes == record
        if assertion.status == "superseded":
            assert assertion.superseded_by is not None


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_op, min_size=1, max_size=8))
def test_the_board_refuses_exactly_the_revisions_the_fold_would_ignore(
    ops: list[tuple[str, str, int, str]],
) -> None:
    async def run() -> None:
        with tempfile.TemporaryDirectory() as folder:
            store = await SqliteEventStore.open(Path(folder) / "events.db")
            board = BeliefBoard(store)
            records: list[str] = []
            for op, actor, pick, value in ops:
                target = records[pick % len(records)] if records else None
                try:
                    if op == "close" and target is not None:
                        await board.close(ANA, target, 10**12, origin=actor)
                    elif op != "close":
                        event = await board.assert_(
                            ANA, "city", value, origin=actor,
                            supersedes=target if op == "revise" else None)
                        records.append(event.data["record"])
                except RevisionRefused:
                    pass
            ana, _ = await board.read(ANA)
            held = ana.slots.get("city", ())
            assert [a.record for a in held] == records
            assert all(a.ignored_supersedes is None for a in held)
            for a in held:
                if a.supersedes is not None:
                    assert ana.assertion(a.supersedes).actor == a.actor  # type: ignore[union-attr]
            await store.close()

    asyncio.run(run())
