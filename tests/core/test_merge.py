"""Identity merge: non-destructive, canonical resolution, no cycles, suspicion is not merge."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_core import MemoryBoard, Projector, SqliteEventStore, VersionConflict, identity_key
from pulse_core._errors import NotAuthorized
from pulse_core._events import Event, EventDraft
from pulse_core._pmap import PersistentMap
from pulse_core.maintenance._authority import Authority
from pulse_core.maintenance._beliefs import BeliefBoard, Beliefs
from pulse_core.maintenance._merge import (
    IdentityMerged,
    MergeLink,
    MergeRefused,
    Merges,
    _stable_read,
    aliases,
    canonical,
    merge_identity,
    read_merges,
    suspect_same,
)


async def _merges(store: SqliteEventStore) -> PersistentMap[str, MergeLink]:
    state: PersistentMap[str, MergeLink] = (await Projector(store, [Merges()]).catch_up())[
        "merges"]
    return state


async def test_a_merge_writes_both_keys_in_one_append_and_resolves_the_source(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    await MemoryBoard(store).register("ana-old", "Ana")
    await MemoryBoard(store).register("ana", "Ana")
    merged, absorbed = await merge_identity(store, "ana-old", "ana", reason="same email",
                                            evidence=("ana-old/x-1",), origin="human:ops")
    assert (merged.kind, merged.key, merged.data["into"]) == (
        "identity-merged", identity_key("ana-old"), "ana")
    assert (absorbed.kind, absorbed.key, absorbed.data) == (
        "identity-absorbed", identity_key("ana"), {"source": "ana-old"})
    assert merged.tx == absorbed.tx and (merged.version, absorbed.version) == (2, 2)
    merges = await _merges(store)
    assert merges["ana-old"] == MergeLink("ana-old", "ana", "same email", ("ana-old/x-1",),
                                          merged.seq, merged.ts, "human:ops")
    assert canonical(merges, "ana-old") == "ana" and canonical(merges, "ana") == "ana"
    assert canonical(merges, "zoe") == "zoe"
    assert await read_merges(store) == merges
    await store.close()


async def test_canonical_follows_a_chain_and_aliases_name_every_member(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    await merge_identity(store, "a", "b", reason="r")
    await merge_identity(store, "b", "c", reason="r")
    await merge_identity(store, "d", "c", reason="r")
    merges = await _merges(store)
    assert [canonical(merges, i) for i in "abcdz"] == ["c", "c", "c", "c", "z"]
    assert aliases(merges, "a") == ("a", "b", "c", "d")
    assert aliases(merges, "z") == ("z",)
    await store.close()


@pytest.mark.parametrize(("setup", "source", "into", "words"), [
    ((), "a", "a", "into itself"),
    ((("a", "b"),), "b", "a", "would form a cycle"),
    ((("a", "b"), ("b", "c")), "c", "a", "would form a cycle"),
    ((("a", "b"),), "a", "c", "already merged into 'b'"),
])
async def test_a_self_merge_a_cycle_or_a_second_merge_of_a_source_is_refused_unwritten(
    tmp_path: Path, setup: tuple[tuple[str, str], ...], source: str, into: str, words: str,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    for s, t in setup:
        await merge_identity(store, s, t, reason="r")
    before = await store.read()
    with pytest.raises(MergeRefused, match=words) as caught:
        await merge_identity(store, source, into, reason="r")
    assert (caught.value.source, caught.value.into) == (source, into)
    assert await store.read() == before
    await store.close()


async def test_the_fold_ignores_a_cyclic_merge_written_past_merge_identity(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    await merge_identity(store, "a", "b", reason="r")
    for source, into in (("b", "a"), ("c", "c"), ("a", "c")):
        await store.append([EventDraft("identity-merged", identity_key(source),
                                       msgspec.to_builtins(IdentityMerged(into=into)))])
    merges = await _merges(store)
    assert {s: link.into for s, link in merges.items()} == {"a": "b"}
    assert canonical(merges, "b") == "b"
    await store.close()


async def test_a_merge_expects_every_version_on_the_targets_chain(tmp_path: Path) -> None:
    # A -> B and C -> D exist; B -> C and D -> A together would close a cycle on keys that
    # neither writes in common. B -> C expects D's version, so D -> A committing first
    # makes B -> C conflict (then its retry sees the cycle).
    store = await SqliteEventStore.open(tmp_path / "events.db")
    await merge_identity(store, "A", "B", reason="r")
    await merge_identity(store, "C", "D", reason="r")
    merges, expect = await _stable_read(store, "B", "C")
    assert set(expect) == {identity_key(i) for i in "BCD"}
    await merge_identity(store, "D", "A", reason="r")
    drafts = [EventDraft("identity-merged", identity_key("B"), {"into": "C"}),
              EventDraft("identity-absorbed", identity_key("C"), {"source": "B"})]
    with pytest.raises(VersionConflict, match="identity:D"):
        await store.append(drafts, expect=expect)
    with pytest.raises(MergeRefused, match="cycle"):
        await merge_identity(store, "B", "C", reason="r")
    assert canonical(await _merges(store), "B") == "B"
    assert merges != await read_merges(store)
    await store.close()


class InterleavedStore(SqliteEventStore):
    """A real SQLite store that lets another writer commit just before its next head()."""

    interleave: Callable[[], Awaitable[object]] | None = None

    async def head(self, key: str) -> int:
        if (other := self.interleave) is not None:
            self.interleave = None
            await other()
        return await super().head(key)


async def test_a_merge_that_commits_between_reads_is_seen_before_the_cycle_closes(
    tmp_path: Path,
) -> None:
    store = await InterleavedStore.open(tmp_path / "events.db")
    assert isinstance(store, InterleavedStore)
    await merge_identity(store, "A", "B", reason="r")
    await merge_identity(store, "C", "D", reason="r")
    store.interleave = lambda: merge_identity(store, "D", "A", reason="r")
    before = await store.last_seq()
    with pytest.raises(MergeRefused, match="cycle"):
        await merge_identity(store, "B", "C", reason="r")
    assert [e.key for e in await store.read(after_seq=before)] == [
        identity_key("D"), identity_key("A")]  # the other writer's merge, and nothing of ours
    await store.close()


async def test_a_merge_needs_the_merge_grant_when_an_authority_is_given(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    authority = Authority(store, standing={"maintenance": ["maintain"]})
    with pytest.raises(NotAuthorized, match="no 'merge' grant"):
        await merge_identity(store, "a", "b", reason="r", origin="executor:maintenance",
                             authority=authority, principal="maintenance")
    assert await store.last_seq() == 0
    with pytest.raises(ValueError, match="principal"):
        await merge_identity(store, "a", "b", reason="r", authority=authority)
    await authority.issue("maintenance", "merge", origin="human:ana")
    merged, _ = await merge_identity(store, "a", "b", reason="r", origin="executor:maintenance",
                                     authority=authority, principal="maintenance")
    assert merged.origin == "executor:maintenance"
    await store.close()


async def test_a_same_as_suspicion_is_an_assertion_and_never_merges(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = BeliefBoard(store, origin="executor:maintenance")
    event = await suspect_same(board, "ana", "ana-work", confidence=0.6,
                               evidence=("ana/x-1",), reason="same alias")
    assert (event.kind, event.data["slot"], event.data["value"], event.data["mode"]) == (
        "assertion-made", "same_as", "ana-work", "inferred")
    state = await Projector(store, [Merges(), Beliefs()]).catch_up()
    assert state["merges"] == {}
    assert canonical(state["merges"], "ana") == "ana"
    assert state["beliefs"]["ana"].slots["same_as"][0].confidence == 0.6
    await store.close()


async def test_merges_survive_a_checkpointed_restart(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    await merge_identity(store, "a", "b", reason="r", evidence=("a/x-1",))
    ckpt = tmp_path / "ckpt"
    projector = Projector(store, [Merges()], checkpoints=ckpt, checkpoint_every=1)
    await projector.catch_up()
    await projector.checkpoint()
    await merge_identity(store, "b", "c", reason="r")
    resumed = await Projector(store, [Merges()], checkpoints=ckpt).catch_up()
    assert resumed == await Projector(store, [Merges()]).catch_up()
    assert canonical(resumed["merges"], "a") == "c"
    await store.close()


NAMES = "abcde"


def _merge_event(seq: int, source: str, into: str) -> Event:
    data: dict[str, Any] = {"into": into}
    return Event(seq, f"e{seq}", "identity-merged", identity_key(source), seq, seq, "agent",
                 None, "t", None, data, None)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(NAMES)), max_size=30))
def test_any_log_of_merges_folds_to_no_cycle_and_canonical_terminates(
    pairs: list[tuple[str, str]],
) -> None:
    fold = Merges()
    state = fold.initial()
    for seq, (source, into) in enumerate(pairs, start=1):
        state = fold.apply(state, _merge_event(seq, source, into))
    for name in NAMES:
        seen, current = [name], name
        while current in state:
            current = state[current].into
            assert current not in seen  # no cycle through the links themselves
            seen.append(current)
        assert canonical(state, name) == current and current not in state


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(NAMES)), max_size=10))
def test_merge_identity_writes_exactly_the_merges_the_fold_keeps(
    pairs: list[tuple[str, str]],
) -> None:
    async def run() -> None:
        with tempfile.TemporaryDirectory() as folder:
            store = await SqliteEventStore.open(Path(folder) / "events.db")
            done: list[tuple[str, str]] = []
            for source, into in pairs:
                before = await store.last_seq()
                try:
                    await merge_identity(store, source, into, reason="r")
                    done.append((source, into))
                except MergeRefused:
                    assert await store.last_seq() == before
            merges = await read_merges(store)
            assert sorted((s, link.into) for s, link in merges.items()) == sorted(done)
            assert len(await store.read(kinds=["identity-merged"])) == len(done)
            await store.close()

    asyncio.run(run())
