"""The payloads and kinds of memory maintenance events, and how elements are named.

Every kind here is keyed `identity:<id>`, like the memory events of pulse_core/memory.py, so
one expected version guards all of an identity's elements. An element is named
"<identity>/<record>".
"""

from __future__ import annotations

import math
from typing import Annotated

import msgspec

from pulse_core._events import register_kind
from pulse_core.store import seal_fields

STAGES = ("active", "archived", "tombstoned")
IMPACTS = ("low", "normal", "high")
COMMITMENT_STATUSES = ("pending", "blocked", "fulfilled", "cancelled")
INSIGHT_STRENGTH = 0.7
MAX_RECORD = 200
"""The longest record id a payload may name."""
MAX_ELEMENT = 512
"""The longest element id ("<identity>/<record>") a payload may name."""

Record = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_RECORD)]
ElementRef = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ELEMENT)]
Stamp = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


def element_id(identity: str, record: str) -> str:
    """The id of `record` of `identity`: "<identity>/<record>"."""
    return f"{identity}/{record}"


def key_destroyed_key(eid: str) -> str:
    """The event key of the record that element `eid`'s key was destroyed."""
    return f"element-key:{eid}"


def split_element_id(eid: str) -> tuple[str, str]:
    """(identity, record) of an element id; the record is after the last "/"."""
    identity, _, record = eid.rpartition("/")
    return identity, record


def _check_unit(value: float, what: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"{what} {value!r} is outside 0..1")


# -- payloads --------------------------------------------------------------------------------


class Metabolized(msgspec.Struct, frozen=True):
    """memory-metabolized: records' memory strength set by a decay sweep of `cycle_start`."""

    cycle_start: Stamp
    factor: float
    strengths: dict[Record, float]

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and 0.0 < self.factor < 1.0):
            raise ValueError(f"factor {self.factor!r} must be strictly between 0 and 1")
        for record, strength in self.strengths.items():  # the message only when it fails
            if not (type(strength) is float and 0.0 <= strength <= 1.0):
                _check_unit(strength, f"strength of {record!r}")


class Reinforced(msgspec.Struct, frozen=True, kw_only=True):
    """memory-reinforced: a record's memory strength set explicitly (an access, a review)."""

    record: Record
    strength: float
    reason: str = ""

    def __post_init__(self) -> None:
        _check_unit(self.strength, "strength")


class SalienceSet(msgspec.Struct, frozen=True, kw_only=True):
    """salience-set: a record's salience (>= the decay policy's protection: never decayed)."""

    record: Record
    salience: float
    reason: str = ""

    def __post_init__(self) -> None:
        _check_unit(self.salience, "salience")


class StageChange(msgspec.Struct, frozen=True, kw_only=True):
    """element-archived/-tombstoned/-restored/-purged, legal-hold-set/-released."""

    record: Record
    reason: str = ""
    activity: str = ""
    channel: str = ""  # the channel of the handle that wrote it (cli, web, engine, ...)


class Correction(msgspec.Struct, frozen=True, kw_only=True):
    """evidence-corrected: record `record` is corrected by record `by`; both stay."""

    record: Record
    by: ElementRef
    reason: str = ""

    def __post_init__(self) -> None:
        if self.by == self.record:
            raise ValueError(f"record {self.record!r} cannot correct itself")


class InsightRecorded(msgspec.Struct, frozen=True, kw_only=True):
    """insight-recorded: an item derived from `derived_from` (element ids or own records)."""

    record: Record
    text: str
    derived_from: tuple[ElementRef, ...]
    activity: str
    salience: float = 0.5

    def __post_init__(self) -> None:
        if self.record in self.derived_from:
            raise ValueError(f"insight {self.record!r} cannot derive from itself")
        _check_unit(self.salience, "salience")


class Consolidated(msgspec.Struct, frozen=True, kw_only=True):
    """element-consolidated: `records` were consolidated into element `to`."""

    records: tuple[ElementRef, ...]
    to: ElementRef

    def __post_init__(self) -> None:
        if self.to in self.records:
            raise ValueError(f"{self.to!r} cannot be consolidated into itself")


class Stale(msgspec.Struct, frozen=True, kw_only=True):
    """derivation-stale: `record`'s root `root` (an element id) was revised: review it."""

    record: Record
    root: ElementRef
    reason: str = ""


class CommitmentMade(msgspec.Struct, frozen=True, kw_only=True):
    """commitment-made: something promised, pending until updated (never expires)."""

    record: Record
    text: str
    due_at: Stamp | None = None
    impact: str = "normal"

    def __post_init__(self) -> None:
        if self.impact not in IMPACTS:
            raise ValueError(f"impact {self.impact!r} is not one of {IMPACTS}")


class CommitmentUpdated(msgspec.Struct, frozen=True, kw_only=True):
    """commitment-updated: a commitment's new status."""

    record: Record
    status: str
    reason: str = ""

    def __post_init__(self) -> None:
        if self.status not in COMMITMENT_STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {COMMITMENT_STATUSES}")


class KeyDestroyed(msgspec.Struct, frozen=True):
    """element-key-destroyed: the key of purged element `element` is gone from keys.db."""

    element: ElementRef


for _kind, _doc, _type in (
    ("memory-metabolized", "a decay sweep set records' memory strength and stamped "
     "last_metabolized_at = cycle_start; key: identity:<id>", Metabolized),
    ("memory-reinforced", "a record's memory strength set explicitly; key: identity:<id>",
     Reinforced),
    ("salience-set", "a record's salience set (protects from decay); key: identity:<id>",
     SalienceSet),
    ("element-archived", "a record archived: kept and readable, out of decay", StageChange),
    ("element-tombstoned", "an archived record tombstoned: kept, marked for purge",
     StageChange),
    ("element-restored", "an archived record made active again", StageChange),
    ("element-purged", "a record purged: gone from the current form, never evidence again",
     StageChange),
    ("legal-hold-set", "a record under legal hold: never purged nor decayed", StageChange),
    ("legal-hold-released", "a record's legal hold released", StageChange),
    ("evidence-corrected", "record `record` is corrected by record `by`; both stay",
     Correction),
    ("insight-recorded", "a derived insight with its inputs (element type insight)",
     InsightRecorded),
    ("element-consolidated", "records consolidated into element `to`", Consolidated),
    ("derivation-stale", "a derived record's root was revised: a review flag only", Stale),
    ("derivation-reviewed", "a stale derived record was reviewed: the flag is cleared",
     StageChange),
    ("commitment-made", "a commitment, pending until updated", CommitmentMade),
    ("commitment-updated", "a commitment's status (pending|blocked|fulfilled|cancelled)",
     CommitmentUpdated),
):
    register_kind(_kind, _doc, _type)

register_kind("element-key-destroyed", "a purged element's key destroyed: its sealed text "
              "is unreadable everywhere; data: element (no key material); key: "
              "element-key:<element>", KeyDestroyed)
seal_fields("insight-recorded", "text")  # element text: sealed with the element's key
seal_fields("commitment-made", "text")

ELEMENT_KINDS = frozenset({
    "memory-metabolized", "memory-reinforced", "salience-set", "element-archived",
    "element-tombstoned", "element-restored", "element-purged", "legal-hold-set",
    "legal-hold-released", "evidence-corrected", "insight-recorded", "element-consolidated",
    "derivation-stale", "derivation-reviewed", "commitment-made", "commitment-updated",
})
