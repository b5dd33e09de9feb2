"""Seed 004 invariants 21 and 22: a fired watch is attention, not authority; silence chosen
at the action gate is recorded, not invisible."""

from __future__ import annotations

from pathlib import Path

import pytest

from pulse_core._errors import NotAuthorized
from pulse_core._events import EventDraft, register_kind
from pulse_core._projector import Projector
from pulse_core.maintenance._activities import read_activity
from pulse_core.maintenance._authority import Authority
from pulse_core.maintenance._watches import (
    WatchArmed,
    WatchCondition,
    Watches,
    arm_watch,
    decide_watch,
    evaluate_watches,
)
from pulse_core.store import SqliteEventStore

register_kind("invariant-watch-note", "a note the watch invariant tests write")
ORIGIN = "executor:maintenance"
PRINCIPALS = ("maintenance", "executor:maintenance", "agent", "w1")


async def test_invariant_21_a_fired_watch_is_attention_not_authority(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    authority = Authority(store)
    before = {p: await authority.grants(p) for p in PRINCIPALS}
    await arm_watch(store, "w1", WatchArmed(
        watch_class="delta", condition=WatchCondition(kinds=("invariant-watch-note",)),
        task_class="purge_review", reason="a purge candidate appeared"), origin=ORIGIN)
    await store.append([EventDraft("invariant-watch-note", "identity:ana", {"record": "r1"})])
    state = (await Projector(store, [Watches()]).catch_up())["watches"]
    result = await evaluate_watches(store, state, 0, 0, origin=ORIGIN)
    assert len(result.fired) == 1
    fire = result.fired[0]
    fired = (await store.read(kinds=["watch-fired"]))[0]
    tx = [e for e in await store.read() if e.tx == fired.tx]
    assert sorted(e.kind for e in tx) == ["activity-recorded", "sleep-task-created",
                                          "watch-fired"]
    assert {e.key.split(":")[0] for e in tx} == {"watch", "sleep", "activity"}
    assert await store.read(kinds=["grant-issued", "grant-revoked"]) == []
    assert {p: await authority.grants(p) for p in PRINCIPALS} == before
    task = next(e for e in tx if e.kind == "sleep-task-created")
    assert task.key == f"sleep:{fire.produced}"
    with pytest.raises(NotAuthorized):  # the produced task asks for work; it grants none
        await authority.require("maintenance", "purge", "purge what the watch pointed at")
    await store.close()


async def test_invariant_22_silence_chosen_at_the_action_gate_is_recorded(tmp_path: Path
                                                                          ) -> None:
    path = tmp_path / "events.db"
    store = await SqliteEventStore.open(path)
    await arm_watch(store, "w1", WatchArmed(watch_class="delta",
                                      condition=WatchCondition(key_prefix="identity:ana")),
              origin=ORIGIN)
    await store.append([EventDraft("invariant-watch-note", "identity:ana", {"record": "r1"})])
    state = (await Projector(store, [Watches()]).catch_up())["watches"]
    fire = (await evaluate_watches(store, state, 0, 0, origin=ORIGIN)).fired[0]
    done = await decide_watch(store, "w1", "silence", "nothing worth saying", inputs=("skill:s1",),
                        origin="agent")
    assert done.ran
    await store.close()

    reopened = await SqliteEventStore.open(path, read_only=True)
    decided = await reopened.read(kinds=["watch-decided"], key="watch:w1")
    assert [(e.data["decision"], e.data["reason"]) for e in decided] == [
        ("silence", "nothing worth saying")]
    gate = await read_activity(reopened, f"action_gate:{fire.operation}")
    assert gate is not None and gate.activity_class == "action_gate"
    assert gate.status == "completed" and gate.report["decision"] == "silence"
    assert gate.inputs == ("watch:w1", f"activity:{fire.operation}", "skill:s1")
    assert decided[0].tx == (await reopened.read(key=f"activity:action_gate:{fire.operation}")
                             )[0].tx
    watches = (await Projector(reopened, [Watches()]).catch_up())["watches"]
    assert watches["w1"].decision == "silence"
    await reopened.close()
