"""The memory model: identities and their records as events, and PersistentMap."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pulse_core import Memory, MemoryBoard, PersistentMap, Projector, SqliteEventStore


async def test_memory_folds_every_record_kind_and_forgetting_removes_evidence(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = MemoryBoard(store)
    await board.register("ana", "Ana")
    first = await board.exchange("ana", "I moved to Lisbon")
    second = await board.exchange("ana", "my cat is called Miso")
    await board.set_state("ana", "city", "Lisbon", confidence=0.8, protected=True)
    await board.open_unresolved("ana", "ask about the new job", priority=2)
    obs = await board.observe("ana", "calendar", "meetings", 3)
    await board.fact("ana", "on holiday in May")
    await board.reflect("ana", "I have been helping Ana settle in")
    projector = Projector(store, [Memory()])
    ana = (await projector.catch_up())["memory"]["ana"]
    assert ana.name == "Ana" and ana.version == 8
    assert ana.last_human is not None and ana.last_human.text == "my cat is called Miso"
    assert ana.state["city"].confidence == 0.8 and ana.state["city"].protected
    assert [u.text for u in ana.unresolved.values()] == ["ask about the new job"]
    assert [o.value for o in ana.observations.values()] == [3]
    assert ana.reflection is not None and ana.reflection.text.startswith("I have")

    await board.forget("ana", second.data["record"], "asked to forget")
    await board.quarantine("ana", obs.data["record"], "sensor glitch")
    ana = (await projector.catch_up())["memory"]["ana"]
    assert ana.last_human is not None and ana.last_human.record == first.data["record"]
    assert ana.observations == {}
    assert second.data["record"] in ana.removed
    await store.close()


async def test_memory_survives_a_checkpointed_restart(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = MemoryBoard(store)
    for i in range(30):
        await board.exchange(f"id-{i % 7}", f"message {i}")
    ckpt = tmp_path / "ckpt"
    first = Projector(store, [Memory()], checkpoints=ckpt, checkpoint_every=1)
    await first.catch_up()
    await first.checkpoint()
    await board.exchange("id-3", "late")
    resumed = await Projector(store, [Memory()], checkpoints=ckpt).catch_up()
    replayed = await Projector(store, [Memory()]).catch_up()
    assert resumed == replayed
    assert isinstance(resumed["memory"], PersistentMap)
    assert resumed["memory"]["id-3"].last_human.text == "late"  # type: ignore[union-attr]
    await store.close()


ops = st.lists(st.tuples(st.booleans(), st.integers(0, 600), st.integers()), max_size=80)


@settings(max_examples=100, deadline=None)
@given(ops=ops)
def test_persistent_map_behaves_like_a_dict_and_never_changes_old_versions(
    ops: list[tuple[bool, int, int]]
) -> None:
    model: dict[int, int] = {}
    current: PersistentMap[int, int] = PersistentMap()
    history = [(current, dict(model))]
    for is_set, key, value in ops:
        before = current
        if is_set:
            model[key] = value
            current = current.set(key, value)
        else:
            model.pop(key, None)
            current = current.delete(key)
        assert current == model and len(current) == len(model)
        assert sorted(current.items()) == sorted(model.items())
        assert sorted(current.values()) == sorted(model.values())
        assert current.get(key) == model.get(key) and current.get(key, "-") == model.get(key, "-")
        assert (key in current) == (key in model)
        changed = current.changed_keys(before)
        assert changed <= {key}
        history.append((current, dict(model)))
    for version, snapshot in history:
        assert version == snapshot


def differing(a: PersistentMap[int, object], b: PersistentMap[int, object]) -> set[int]:
    return {k for k in a.keys() | b.keys() if k not in a or k not in b or a[k] is not b[k]}


@settings(max_examples=100, deadline=None)
@given(start=st.dictionaries(st.integers(0, 300), st.integers(), max_size=50),
       ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 300), st.integers()),
                    max_size=60))
def test_changed_keys_between_any_two_versions_are_the_keys_that_differ(
    start: dict[int, int], ops: list[tuple[int, int, int]],
) -> None:
    """Between a version and one it was made from (its log read), and between unrelated
    versions or siblings (buckets compared)."""
    versions = [PersistentMap(start), PersistentMap(dict(start))]  # equal, unrelated
    for op, key, value in ops:
        base = versions[value % len(versions)] if op == 3 else versions[-1]
        if op == 0:
            versions.append(base.delete(key))
        elif op == 1:
            versions.append(base.update({key: value, key + 1: value, key * 2: value}))
        else:
            versions.append(base.set(key, value if op == 2 else base.get(key, value)))
    for new in versions:
        for old in versions:
            assert new.changed_keys(old) == differing(new, old)


def test_changed_keys_across_thousands_of_changes_are_the_keys_that_differ() -> None:
    """A version made from another by more changes than its log keeps is still diffed."""
    versions = [PersistentMap({n: n for n in range(100)})]
    for n in range(20_000):
        versions.append(versions[-1].set(n % 300, n) if n % 7 else versions[-1].delete(n % 90))
        if n == 15_000:  # and one change of many keys at once
            versions.append(versions[-1].update({k: n for k in range(1_000)}))
    for new, old in [(-1, 0), (-1, 10_000), (-1, -4_000), (-1, -5_000), (-2, -1), (12_000, 7_000),
                     (5_000, 4_000), (4_097, 4_095), (15_003, 15_000), (15_002, 15_001)]:
        assert versions[new].changed_keys(versions[old]) == differing(versions[new],
                                                                      versions[old])


@settings(max_examples=100, deadline=None)
@given(start=st.dictionaries(st.integers(0, 2000), st.integers(), max_size=300),
       changes=st.dictionaries(st.integers(0, 2000), st.integers(), max_size=300))
def test_persistent_map_update_binds_every_change_and_leaves_the_original_alone(
    start: dict[int, int], changes: dict[int, int]
) -> None:
    original = PersistentMap(start)
    updated = original.update(changes)
    assert updated == {**start, **changes} and len(updated) == len({**start, **changes})
    assert original == start
    assert updated.changed_keys(original) == {k for k, v in changes.items()
                                               if k not in start or start[k] is not v}
