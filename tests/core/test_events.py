"""Drafts checked on their fast paths, and UUIDv7s made many at a time."""

from __future__ import annotations

import math
import re
import uuid
from typing import Any

import pytest

from pulse_core import EventDraft
from pulse_core._errors import InvalidEvent, PayloadNotEncodable, UnknownKind
from pulse_core._events import _GOOD_ORIGINS_KEPT, _good_origins, check_draft, uuid7


def test_ids_made_together_and_one_by_one_sort_in_call_order_and_are_uuid7() -> None:
    ids = [*uuid7.many(5_000), *(uuid7() for _ in range(1_000)), *uuid7.many(3)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    for text in ids[:50] + ids[-50:]:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
        assert str(parsed) == text


def test_a_batch_past_the_counter_borrows_the_next_millisecond() -> None:
    """5,000 ids cannot share one millisecond's 4,096 counter values: the stamp moves on."""
    ids = uuid7.many(5_000)
    stamps = {int(text.replace("-", "")[:12], 16) for text in ids}
    assert len(stamps) >= 2
    assert ids == sorted(ids)
    shape = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
    assert all(shape.fullmatch(text) for text in ids)


def test_the_variant_digit_carries_random_bits() -> None:
    digits = {text[19] for text in uuid7.many(2_000)}
    assert digits == set("89ab")


def draft(**fields: Any) -> EventDraft:
    return EventDraft(**{"kind": "mark", "key": "mark:k", "data": {"n": 1}, **fields})


def test_an_origin_is_refused_after_valid_ones_were_remembered() -> None:
    check_draft(draft(origin="rule:remembered"))
    assert "rule:remembered" in _good_origins
    for origin in ("rule:with space", "nobody", "agent:\ud800", ["agent"], None, 7):
        with pytest.raises(InvalidEvent, match="origin"):
            check_draft(draft(origin=origin))
    assert not any(type(o) is not str or " " in o for o in _good_origins)


def test_remembered_origins_stay_few() -> None:
    for n in range(_GOOD_ORIGINS_KEPT + 10):
        check_draft(draft(origin=f"watcher:w{n}"))
    assert len(_good_origins) <= _GOOD_ORIGINS_KEPT


@pytest.mark.parametrize("key", ["k\0", "k\udc80", "", "k" * 513, 7, b"k"])
def test_a_bad_key_is_refused_whatever_its_characters(key: Any) -> None:
    with pytest.raises(InvalidEvent, match="key"):
        check_draft(draft(key=key))


def test_a_key_and_idem_beyond_ascii_are_stored_as_given() -> None:
    check_draft(draft(key="clé:✓", idem="req-é"))
    with pytest.raises(InvalidEvent, match="idem"):
        check_draft(draft(idem="req\0"))


@pytest.mark.parametrize("kind", ["Not-Kebab", "no_underscores", ["mark"], 7])
def test_a_kind_outside_kebab_case_is_refused_before_the_catalogue(kind: Any) -> None:
    with pytest.raises(InvalidEvent, match="kebab"):
        check_draft(draft(kind=kind))


def test_an_unknown_kebab_kind_names_the_catalogue() -> None:
    with pytest.raises(UnknownKind):
        check_draft(draft(kind="never-registered-kind"))


@pytest.mark.parametrize("data", [{"x": math.nan}, [0.5, math.inf], {"ok": 1.5, "x": -math.inf}])
def test_a_float_that_is_not_a_json_number_is_refused_beside_finite_ones(data: Any) -> None:
    with pytest.raises(PayloadNotEncodable, match=r"^draft 3 \('mark' on 'mark:k'\): "):
        check_draft(draft(data=data), 3)


def test_finite_floats_encode_as_themselves() -> None:
    assert check_draft(draft(data={"a": 0.25, "b": [1.5, -2.0]})) == \
        b'{"a":0.25,"b":[1.5,-2.0]}'
