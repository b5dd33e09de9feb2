"""Authority: grants issued and revoked only by humans, read afresh at every check, plus
standing grants; writer ranks."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulse_core import EventDraft, InvalidEvent, SqliteEventStore
from pulse_core._errors import NotAuthorized
from pulse_core.maintenance._authority import (
    AGENT,
    BACKGROUND,
    HUMAN,
    PERMISSIONS,
    Authority,
    authority_key,
    fold_grants,
    outranks,
    rank,
)
from pulse_core.maintenance._governance import (
    Governance,
    activate_schema,
    read_governance,
    set_trust_policy,
)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    opened = await SqliteEventStore.open(tmp_path / "events.db")
    yield opened
    await opened.close()


def grant_draft(principal: str, permission: str, origin: str, *, revoke: bool = False,
                key: str | None = None) -> EventDraft:
    kind = "grant-revoked" if revoke else "grant-issued"
    return EventDraft(kind, key or authority_key(principal),
                      {"principal": principal, "permission": permission}, origin=origin)


async def test_a_principal_holds_nothing_until_a_human_grants_it(
    store: SqliteEventStore,
) -> None:
    authority = Authority(store)
    assert await authority.grants("maintenance") == frozenset()
    with pytest.raises(NotAuthorized) as refused:
        await authority.require("maintenance", "archive", "archive ana/x-1")
    assert refused.value.principal == "maintenance" and refused.value.permission == "archive"
    assert "'maintenance' may not archive ana/x-1" in str(refused.value)
    assert "Authority.issue('maintenance', 'archive'" in str(refused.value)
    event = await authority.issue("maintenance", "archive", origin="human:ana",
                                  reason="nightly cleanup")
    assert (event.kind, event.key, event.origin) == ("grant-issued", "authority:maintenance",
                                                     "human:ana")
    assert event.data == {"principal": "maintenance", "permission": "archive",
                          "reason": "nightly cleanup", "channel": "library"}
    await authority.require("maintenance", "archive", "archive ana/x-1")
    assert await authority.grants("maintenance") == {"archive"}
    assert not await authority.allows("maintenance", "purge")  # one grant is one permission
    assert not await authority.allows("awareness", "archive")  # and one principal's


@pytest.mark.parametrize("origin", ["agent", "agent:import", "engine", "executor:maintenance",
                                    "executor:awareness", "rule:cleanup", "watcher:disk",
                                    "survival"])
async def test_only_a_human_origin_issues_or_revokes_a_grant(
    store: SqliteEventStore, origin: str,
) -> None:
    authority = Authority(store)
    for write in (authority.issue, authority.revoke):
        with pytest.raises(NotAuthorized, match="only a human") as refused:
            await write("maintenance", "purge", origin=origin)
        assert refused.value.permission == "elevate_authority"
    assert await store.last_seq() == 0


@pytest.mark.parametrize("origin", ["human", "human:ana", "cli"])
async def test_a_human_or_the_operator_at_the_cli_issues_grants(
    store: SqliteEventStore, origin: str,
) -> None:
    authority = Authority(store)
    await authority.issue("maintenance", "retention", origin=origin)
    assert await authority.allows("maintenance", "retention")


@pytest.mark.parametrize("origin", ["agent", "agent:import", "engine", "executor:maintenance",
                                    "rule:x", "survival"])
async def test_a_grant_event_a_non_human_appended_grants_nothing(
    store: SqliteEventStore, origin: str,
) -> None:
    await store.append([grant_draft("maintenance", "purge", origin)])
    assert await Authority(store).grants("maintenance") == frozenset()


async def test_a_grant_filed_under_another_principals_key_grants_nothing(
    store: SqliteEventStore,
) -> None:
    await store.append([grant_draft("maintenance", "purge", "human",
                                    key=authority_key("awareness"))])
    authority = Authority(store)
    assert await authority.grants("maintenance") == frozenset()
    assert await authority.grants("awareness") == frozenset()
    assert fold_grants(await store.read()) == {}


async def test_a_revocation_is_read_at_the_next_check(store: SqliteEventStore) -> None:
    authority = Authority(store)
    await authority.issue("maintenance", "purge", origin="human:ana")
    await authority.require("maintenance", "purge", "purge")
    await Authority(store).revoke("maintenance", "purge", origin="human:bob")  # elsewhere
    with pytest.raises(NotAuthorized):
        await authority.require("maintenance", "purge", "purge")
    await authority.issue("maintenance", "purge", origin="human:ana")
    await authority.require("maintenance", "purge", "purge")  # granted again


async def test_check_returns_the_version_the_decision_read(store: SqliteEventStore) -> None:
    authority = Authority(store, standing={"maintenance": ["maintain"]})
    assert await authority.check("maintenance", "maintain", "sweep") == 0
    await authority.issue("maintenance", "archive", origin="human")
    await authority.issue("maintenance", "merge", origin="human")
    assert await authority.check("maintenance", "archive", "archive") == 2
    assert (await store.head(authority_key("maintenance"))) == 2


async def test_standing_grants_count_and_a_revoke_does_not_remove_them(
    store: SqliteEventStore,
) -> None:
    authority = Authority(store, standing={"maintenance": ["read", "maintain"]})
    assert await authority.grants("maintenance") == {"read", "maintain"}
    await authority.issue("maintenance", "archive", origin="human")
    await authority.revoke("maintenance", "maintain", origin="human")
    assert await authority.grants("maintenance") == {"read", "maintain", "archive"}
    assert await Authority(store).grants("maintenance") == {"archive"}


async def test_unknown_permissions_are_refused_everywhere(store: SqliteEventStore) -> None:
    authority = Authority(store)
    with pytest.raises(InvalidEvent, match="'fly' is not one of"):
        await authority.issue("maintenance", "fly", origin="human")
    with pytest.raises(InvalidEvent):
        await authority.issue(" padded ", "read", origin="human")
    with pytest.raises(InvalidEvent):  # the store validates the payload of a raw append
        await store.append([grant_draft("maintenance", "fly", "human")])
    assert await store.last_seq() == 0
    with pytest.raises(ValueError, match="'fly' is not one of"):
        Authority(store, standing={"maintenance": ["read", "fly"]})
    generous = Authority(store, standing={"maintenance": list(PERMISSIONS)})
    with pytest.raises(NotAuthorized, match="'fly' is not a permission any grant can name"):
        await generous.require("maintenance", "fly", "fly away")


def test_writer_ranks() -> None:
    assert [rank(o) for o in ("human", "human:ana", "cli", "cli:ops")] == [HUMAN] * 4
    assert [rank(o) for o in ("agent", "agent:chat", "agent:import")] == [AGENT] * 3
    assert [rank(o) for o in ("executor:awareness", "executor:maintenance", "engine",
                              "rule:x", "watcher:y", "survival", "")] == [BACKGROUND] * 7
    assert outranks("human:ana", "agent") and outranks("agent", "executor:awareness")
    assert outranks("cli", "executor:maintenance")
    assert not outranks("agent", "human") and not outranks("human", "human:bob")
    assert not outranks("executor:awareness", "executor:maintenance")
    assert not outranks("humanoid", "executor:x")  # a prefix is not a rank


ORIGINS = st.sampled_from(["human", "human:ana", "cli", "agent", "agent:import", "engine",
                           "executor:maintenance"])
STEPS = st.lists(st.tuples(st.booleans(), st.sampled_from(["read", "purge", "archive"]),
                           ORIGINS), max_size=12)


@settings(max_examples=40, deadline=None)
@given(steps=STEPS)
def test_grants_are_what_the_humans_last_said_whatever_the_others_write(
    steps: list[tuple[bool, str, str]],
) -> None:
    async def scenario(folder: Path) -> None:
        store = await SqliteEventStore.open(folder / "events.db")
        try:
            authority = Authority(store)
            expected: set[str] = set()
            for revoke, permission, origin in steps:
                await store.append([grant_draft("maintenance", permission, origin,
                                                revoke=revoke)])
                if rank(origin) == HUMAN:
                    (expected.discard if revoke else expected.add)(permission)
                assert await authority.grants("maintenance") == expected
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder)))


# -- governed control state ------------------------------------------------------------------


async def test_the_trust_policy_is_replaced_whole_and_schemas_accumulate(
    store: SqliteEventStore,
) -> None:
    authority = Authority(store, standing={"operator": ["manage_trust", "manage_schema"]})
    assert await read_governance(authority) == Governance()
    await set_trust_policy(authority, "operator", {"a": 1, "b": 2}, origin="cli")
    second = await set_trust_policy(authority, "operator", {"b": 3}, origin="cli",
                                    reason="a is gone")
    assert second.data == {"principal": "operator", "policy": {"b": 3}, "reason": "a is gone"}
    for package in ("kip-core", "kip-memory", "kip-core"):
        await activate_schema(authority, "operator", package, origin="cli")
    governance = await read_governance(authority)
    assert governance.trust is not None
    assert (governance.trust.policy, governance.trust.seq) == ({"b": 3}, second.seq)
    assert [s.package for s in governance.schemas] == ["kip-core", "kip-memory"]
    assert governance.ignored == ()
    # the same log read without the operator's standing grants: nothing of it governs
    bare = await read_governance(Authority(store))
    assert bare.trust is None and bare.schemas == () and len(bare.ignored) == 5


async def test_control_state_on_the_wrong_key_governs_nothing(store: SqliteEventStore) -> None:
    authority = Authority(store)
    await authority.issue("operator", "manage_trust", origin="human")
    await store.append([EventDraft("trust-policy-set", "governance:other",
                                   {"principal": "operator", "policy": {"x": 1}},
                                   origin="cli")])
    assert (await read_governance(authority)).trust is None
    with pytest.raises(InvalidEvent):
        await activate_schema(Authority(store, standing={"o": ["manage_schema"]}), "o", " ",
                              origin="cli")
