"""Principals: a store handle's principal is given by the channel that opened it, and no
label an agent or the engine chooses grants anything. Every refusal is recorded, and
nothing else is written."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulse_core import (
    Effect,
    Engine,
    EventDraft,
    EventStore,
    ExecutionContext,
    Executor,
    MemoryBoard,
    NotAuthorized,
    Principal,
    PrincipalRefused,
    SqliteEventStore,
    effect_draft,
    open_home,
)
from pulse_core._principals import PERSON_KINDS, WRITE_REFUSED
from pulse_core.maintenance import Authority, ElementsReader, RetentionLadder

AGENT = Principal.agent("hermes", "hermes-plugin")
ENGINE = Principal.engine()


@pytest.fixture
async def home(tmp_path: Path) -> AsyncIterator[EventStore]:
    """A home's log held by a person (the library's default), closed after the test."""
    stores = await open_home(tmp_path / "home")
    try:
        yield stores.events
    finally:
        await stores.close()


async def written(store: EventStore) -> list[tuple[str, str, str]]:
    """Every event of the log but the refusal records, as (kind, key, origin)."""
    return [(e.kind, e.key, e.origin) for e in await store.read() if e.kind != WRITE_REFUSED]


# -- the rule ---------------------------------------------------------------------------------

HUMAN_ORIGINS = ["human", "human:ana", "cli", "cli:ops"]


@pytest.mark.parametrize("origin", HUMAN_ORIGINS)
def test_neither_the_engine_nor_an_agent_writes_a_persons_origin(origin: str) -> None:
    assert Principal.human("cli").allows("state-set", origin)
    assert not ENGINE.allows("state-set", origin)
    assert not AGENT.allows("state-set", origin)


def test_an_agent_writes_only_its_own_name() -> None:
    allowed = ["agent", "agent:hermes", "agent:hermes-plugin:broken", "agent:hermes:x"]
    refused = ["agent:openclaw", "agent:hermesx", "engine", "executor:maintenance",
               "survival", "rule:awareness"]
    assert [o for o in allowed if AGENT.allows("task-created", o)] == allowed
    assert [o for o in refused if AGENT.allows("task-created", o)] == []
    assert all(ENGINE.allows("task-created", o) for o in [*allowed, *refused])


@given(kind=st.sampled_from(sorted(PERSON_KINDS)),
       origin=st.from_regex(r"\A(agent|engine|executor|human|cli)(:[a-z]{1,8})?\Z"))
def test_only_a_person_appends_the_kinds_that_move_authority(kind: str, origin: str) -> None:
    assert Principal.human("web").allows(kind, origin)
    assert not ENGINE.allows(kind, origin)
    assert not AGENT.allows(kind, origin)


def test_a_handle_is_only_ever_narrowed() -> None:
    Principal.human("cli").acting_as(AGENT)
    ENGINE.acting_as(AGENT)
    AGENT.acting_as(AGENT)
    for holder, wanted in ((AGENT, ENGINE), (AGENT, Principal.human()),
                           (ENGINE, Principal.human("web")),
                           (AGENT, Principal.agent("openclaw", "mcp"))):
        with pytest.raises(NotAuthorized, match="only ever narrowed"):
            holder.acting_as(wanted)


def test_a_principal_is_checked_when_made() -> None:
    with pytest.raises(ValueError, match="needs the agent's name"):
        Principal.agent("", "mcp")
    with pytest.raises(ValueError, match="channel"):
        Principal.agent("hermes", "Hermes Plugin")


# -- the store refuses, records, and keeps the rest ----------------------------------------------

async def test_an_agents_forged_human_origin_is_refused_recorded_and_nothing_else_stored(
        home: EventStore) -> None:
    agent = home.as_principal(AGENT)
    await agent.append([EventDraft("task-created", "task:t-1", {"task": "t-1", "title": "x"},
                                   origin="agent:hermes")])
    before = await written(home)
    for _ in range(3):  # a flood records one line a minute
        with pytest.raises(PrincipalRefused) as refused:
            await agent.append([
                EventDraft("task-created", "task:t-2", {"task": "t-2", "title": "y"},
                           origin="agent:hermes"),
                EventDraft("state-set", "identity:ana", {"record": "s-1", "name": "role",
                                                         "value": "admin"},
                           origin="human:ana")])
    assert "agent:hermes (via hermes-plugin) may not write origin 'human:ana'" in str(
        refused.value)
    assert await written(home) == before  # the whole append refused, its good draft too
    (record,) = await home.read(kinds=[WRITE_REFUSED])
    assert record.origin == "agent:hermes" and record.key == "principal:agent:hermes"
    assert record.data == {"principal": "agent:hermes", "channel": "hermes-plugin",
                           "origin": "human:ana", "kind": "state-set", "key": "identity:ana"}


async def test_the_label_alone_grants_nothing(home: EventStore) -> None:
    authority = Authority(home)
    for principal in (AGENT, ENGINE):
        forger = home.as_principal(principal)
        with pytest.raises(PrincipalRefused, match="kind 'grant-issued': only a person"):
            await Authority(forger).issue("agent", "purge", origin="human:anyone")
        with pytest.raises(PrincipalRefused):  # the raw append, with any origin at all
            await forger.append([EventDraft(
                "grant-issued", "authority:agent",
                {"principal": "agent", "permission": "purge"},
                origin="agent:hermes" if principal is AGENT else "engine")])
    assert await authority.grants("agent") == frozenset()
    assert await written(home) == []
    assert len(await home.read(kinds=[WRITE_REFUSED])) == 4  # per principal, kind, origin
    # a person may, and the grant records the channel that authenticated them
    cli = home.as_principal(Principal.human("cli"))
    grant = await Authority(cli).issue("agent", "purge", origin="human:ana")
    assert grant.data["channel"] == "cli"
    assert await authority.grants("agent") == {"purge"}


async def test_quarantine_purge_and_lifting_a_hold_need_a_person_whatever_the_grants(
        home: EventStore) -> None:
    board = MemoryBoard(home)
    seen = await board.observe("ana", "scale", "kg", 80)
    held = f"ana/{(await board.observe('ana', 'scale', 'kg', 81)).data['record']}"
    record = str(seen.data["record"])
    free = f"ana/{record}"
    every = ("archive", "retention", "purge")
    person = RetentionLadder(home, ElementsReader(home), Authority(
        home, standing={"maintenance": every}), "maintenance", origin="human:ana")
    for eid in (free, held):
        await person.archive(eid)
    await person.set_hold(held, "litigation")
    before = await home.read()
    for principal, origin in ((AGENT, "agent:hermes"), (ENGINE, "executor:maintenance")):
        handle = home.as_principal(principal)
        ladder = RetentionLadder(handle, ElementsReader(handle), Authority(
            handle, standing={"maintenance": every}), "maintenance", origin=origin)
        with pytest.raises(PrincipalRefused, match="kind 'element-purged': only a person"):
            await ladder.purge(free, confirm=free)
        with pytest.raises(PrincipalRefused, match="kind 'legal-hold-released': only a"):
            # the forged label passes the ladder's own check; the handle's principal stops it
            await ladder_of(handle, every, "human:forged").release_hold(held)
        with pytest.raises(NotAuthorized, match="only a person does"):
            await MemoryBoard(handle, origin=origin).quarantine("ana", record, "hide it")
        with pytest.raises(PrincipalRefused):
            await handle.append([EventDraft("record-quarantined", "identity:ana",
                                            {"record": record}, origin=origin)])
        with pytest.raises(NotAuthorized):
            await handle.quarantine(seen.seq, "hide it")
    assert [e for e in await home.read() if e.kind != WRITE_REFUSED] == before
    refused = {(e.data["principal"], e.data["kind"]) for e in await home.read(
        kinds=[WRITE_REFUSED])}
    assert refused == {(who, kind) for who in ("agent:hermes", "engine") for kind in (
        "element-purged", "legal-hold-released", "record-quarantined", "event-quarantined")}
    state = await ElementsReader(home).current()
    assert state.elements[held].legal_hold and free in state.elements
    # the person's own handle does all of it
    await person.release_hold(held)
    await person.purge(free, confirm=free)
    assert free not in (await ElementsReader(home).current()).elements


def ladder_of(store: EventStore, grants: tuple[str, ...], origin: str) -> RetentionLadder:
    return RetentionLadder(store, ElementsReader(store), Authority(
        store, standing={"maintenance": grants}), "maintenance", origin=origin)


# -- the engine's executors write as the engine -----------------------------------------------

class Escalate(Effect, tag="escalate"):
    """Ask the executor to grant itself purge."""


class Escalating(Executor):
    """Business code that tries to write a person's grant through its context."""

    handles = (Escalate,)
    max_attempts = 1

    async def execute(self, effect: Escalate, ctx: ExecutionContext) -> dict[str, Any]:
        await Authority(ctx.events).issue("agent", "purge", origin="human:owner")
        return {"escalated": True}


async def test_an_executor_cannot_forge_a_persons_grant_through_its_context(
        tmp_path: Path) -> None:
    async with Engine(tmp_path / "home", executors=[Escalating()]) as engine:
        stored = await engine.append([effect_draft(Escalate(), origin="agent")])
        effect_id = stored.events[0].key
        await engine.executor_loop.run_until_idle()
        (failed,) = await engine.events.read(kinds=["effect-failed"], key=effect_id)
        assert "PrincipalRefused" in failed.data["error"]
        assert "engine may not write an event of kind 'grant-issued'" in failed.data["error"]
        assert await Authority(engine.events).grants("agent") == frozenset()


# -- a real second process: the agent's channel -------------------------------------------------

ESCALATION = r"""
import asyncio, sys
from pulse_core import PrincipalRefused, NotAuthorized
from pulse_core.maintenance import Authority
from pulse_adapters.hermes import HermesPlugin, PluginSettings

async def escalate(events):
    outcomes = []
    for attempt in (lambda: Authority(events).issue("agent", "purge", origin="human:anyone"),
                    lambda: events.quarantine(1, "hide it")):
        try:
            await attempt()
            outcomes.append("granted")
        except (PrincipalRefused, NotAuthorized) as exc:
            outcomes.append(type(exc).__name__)
    return outcomes

plugin = HermesPlugin(PluginSettings(home=sys.argv[1], embed=False))
plugin.bridge.start()  # as register() does in Hermes' process
print(plugin.bridge.call(escalate, "escalate", timeout_s=60.0))
plugin.bridge.close()
"""


async def test_the_hermes_plugins_channel_in_another_process_cannot_escalate(
        tmp_path: Path) -> None:
    async with Engine(tmp_path / "home") as engine:
        await MemoryBoard(engine.events).observe("ana", "scale", "kg", 80)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", ESCALATION, str(engine.home),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert out.decode().strip() == "['PrincipalRefused', 'NotAuthorized']"
        assert await Authority(engine.events).grants("agent") == frozenset()
        refusals = await engine.events.read(kinds=[WRITE_REFUSED])
        assert [(r.data["principal"], r.data["kind"]) for r in refusals] == [
            ("agent:hermes", "grant-issued"), ("agent:hermes", "event-quarantined")]


async def test_a_sqlite_store_opened_directly_is_a_persons(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        assert store.principal == Principal.human("library")
    finally:
        await store.close()
