"""Sealing element text: any value round-trips through its element's key, a token opens for
its own element only, and once the key is destroyed nothing opens it again."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_core import ElementTextUnreadable
from pulse_core.store import PURGED_TEXT, ElementKeys, is_sealed, reveal, sealed_element

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
ELEMENT = st.from_regex(r"[a-z0-9:-]{1,12}/[a-z0-9-]{1,12}", fullmatch=True)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> ElementKeys:
    return ElementKeys(tmp_path_factory.mktemp("keys") / "keys.db")


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture],
          deadline=None)
@given(element=ELEMENT, text=st.text())
def test_any_text_round_trips_and_seals_the_same_way_twice(
        keys: ElementKeys, element: str, text: str) -> None:
    token = keys.seal(element, text)
    assert is_sealed(token) and token.endswith(f":{element}")
    assert keys.open(token) == text
    assert keys.seal(element, text) == token  # an idempotent append stores the same bytes
    assert keys.seal(element, token) == token  # sealing twice changes nothing


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture],
          deadline=None)
@given(element=ELEMENT, value=JSON)
def test_any_json_value_round_trips(keys: ElementKeys, element: str, value: Any) -> None:
    assert reveal(keys.seal(element, value), keys) == reveal(value, keys)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture],
          deadline=None)
@given(record=st.from_regex(r"[a-z0-9-]{1,16}", fullmatch=True), text=st.text(min_size=1),
       data=st.binary())
def test_a_purged_element_never_opens_again(
        keys: ElementKeys, record: str, text: str, data: bytes) -> None:
    element = f"purged-{uuid.uuid4().hex[:8]}/{record}"  # a new element every example
    token = keys.seal(element, text)
    blob = keys.seal_bytes(element, data)
    key = keys.key(element)
    assert key is not None and keys.open_bytes(element, blob) == data
    assert keys.destroy(element)
    written_after = keys.seal(element, text)  # text given to a purged element: kept nowhere
    assert keys.key(element) is None
    for attempt in (lambda: keys.open(token), lambda: keys.open_bytes(element, blob),
                    lambda: keys.open(written_after)):
        with pytest.raises(ElementTextUnreadable, match="purged") as raised:
            attempt()
        assert raised.value.purged and raised.value.element == element
    assert reveal([token], keys) == [PURGED_TEXT]
    assert keys.load({element: "AAAA"}) == 0  # a destroyed key is never loaded back
    assert key not in keys.path.read_bytes()
    wal = keys.path.with_name("keys.db-wal")
    assert not wal.exists() or wal.stat().st_size == 0


def test_a_token_opens_for_its_own_element_only(tmp_path: Path) -> None:
    keys = ElementKeys(tmp_path / "keys.db")
    token = keys.seal("ana/x-1", "hello")
    body = token.rpartition(":")[0]
    keys.seal("ana/x-2", "other")  # x-2 has a key of its own
    with pytest.raises(ElementTextUnreadable, match="'ana/x-2' does not open"):
        keys.open(f"{body}:ana/x-2")
    read_only = ElementKeys(tmp_path / "missing.db", read_only=True)
    assert not (tmp_path / "missing.db").exists()
    reader = ElementKeys(tmp_path / "keys.db", read_only=True)  # beside the live writer
    assert reader.open(token) == "hello"
    reader.close()
    with pytest.raises(ElementTextUnreadable, match="no key for element 'ana/x-1'"):
        read_only.open(token)
    with pytest.raises(ElementTextUnreadable, match="has no keys"):
        reveal(token, None)


def test_a_keys_file_of_another_program_is_refused_by_name(tmp_path: Path) -> None:
    import sqlite3

    from pulse_core import NotAPulseDatabase

    other = sqlite3.connect(tmp_path / "keys.db")
    other.execute("CREATE TABLE t (x)")
    other.commit()
    other.close()
    with pytest.raises(NotAPulseDatabase, match=r"keys\.db"):
        ElementKeys(tmp_path / "keys.db")


def test_keys_read_in_one_statement_open_their_texts_and_a_purged_one_reads_as_purged(
        tmp_path: Path) -> None:
    keys = ElementKeys(tmp_path / "keys.db")
    tokens = [keys.seal(f"id:a/x-{i}", f"text {i}") for i in range(3)]
    assert keys.destroy("id:a/x-2")
    known = keys.keys_of([sealed_element(t) for t in tokens] + ["id:a/never"])
    assert known == {e: keys.key(e) for e in ("id:a/x-0", "id:a/x-1")}
    assert [reveal(t, keys, known=known) for t in tokens] == ["text 0", "text 1", PURGED_TEXT]
    with pytest.raises(ElementTextUnreadable, match="'id:a/x-0' does not open"):
        reveal(tokens[0], keys, known={"id:a/x-0": known["id:a/x-1"]})  # the key given is used
    assert keys.keys_of([]) == {}


def test_a_search_reads_the_keys_of_what_it_found_when_they_are_few(tmp_path: Path) -> None:
    keys = ElementKeys(tmp_path / "keys.db")
    keys.index([(f"id:a/x-{i}", f"note {i} about the sea") for i in range(3)]
               + [("id:a/x-3", "a rare zanzibar note")])
    made = keys.keys_for(["id:a/x-0", "id:a/x-1", "id:a/x-3"])  # x-2 has no key
    few = keys.search_keyed(["sea"], 3)
    assert few is not None and few.elements == {"id:a/x-0", "id:a/x-1", "id:a/x-2"}
    assert few.keys == {e: made[e] for e in ("id:a/x-0", "id:a/x-1")}
    many = keys.search_keyed(["sea"], 2)  # more than asked for: no key read
    assert many is not None and many.elements == few.elements and many.keys is None
    assert keys.search_keyed(["note"], 0) == (keys.search(["note"]), None)
    keys.destroy("id:a/x-3")  # its index row goes with its key
    assert keys.search_keyed(["zanzibar"], 3) == (set(), {})
