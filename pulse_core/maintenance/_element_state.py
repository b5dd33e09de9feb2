"""The memory elements' state: an element, a commitment, and all of them with each
identity's version (the fold is in _element_fold.py, the projection in _elements.py)."""

from __future__ import annotations

import msgspec

from pulse_core._pmap import PersistentMap

# -- state -------------------------------------------------------------------------------------


class Commitment(msgspec.Struct, frozen=True, gc=False):
    """A commitment element's own fields."""

    text: str
    due_at: int | None
    impact: str
    status: str = "pending"
    updated_at: int = 0


class Element(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """One memory record of an identity, as maintenance sees it (no confidence: never truth).

    `retracted` marks a state item retracted or an unresolved item resolved (kept for lineage,
    out of decay); `revised_seq` is the seq of the last revision of the record (state revised,
    retracted or re-set; evidence corrected), which the derivation review compares against.
    `references` are the element ids this element cites (derived_from, corrects, an
    assertion's evidence); `referenced_by` the live elements citing this one (purge refuses).
    """

    id: str
    identity: str
    record: str
    type: str
    created_at: int
    created_seq: int
    writer: str
    strength: float = 1.0
    salience: float = 0.0
    last_metabolized_at: int | None = None
    stage: str = "active"
    legal_hold: bool = False
    stale: bool = False
    derived_from: tuple[str, ...] = ()
    consolidated_to: tuple[str, ...] = ()
    corrects: str | None = None
    corrected_by: str | None = None
    digest: str | None = None
    payload_purged: bool = False
    retracted: bool = False
    revised_seq: int | None = None
    stale_roots: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    referenced_by: tuple[str, ...] = ()
    commitment: Commitment | None = None
    updated_seq: int = 0


class ElementsState(msgspec.Struct, frozen=True):
    """Every live element by id, each identity's key version, and the ids gone for good."""

    elements: PersistentMap[str, Element] = msgspec.field(default_factory=PersistentMap)
    versions: PersistentMap[str, int] = msgspec.field(default_factory=PersistentMap)
    purged: frozenset[str] = frozenset()
    forgotten: frozenset[str] = frozenset()
    digests: PersistentMap[str, tuple[str, ...]] = msgspec.field(
        default_factory=PersistentMap)
    seq: int = 0
    pending: PersistentMap[str, tuple[str, ...]] = msgspec.field(
        default_factory=PersistentMap)
    foreign: PersistentMap[str, str] = msgspec.field(default_factory=PersistentMap)
    payloads_purged: frozenset[str] = frozenset()


def live_references(elements: PersistentMap[str, Element], element: Element) -> list[str]:
    """The live elements that still need `element`: derived from it, consolidated from it,
    cite it, or were corrected by it (its `corrects`: their `corrected_by` names it)."""
    found = (*element.referenced_by, *element.consolidated_to,
             *((element.corrects,) if element.corrects is not None else ()))
    return sorted({r for r in found if r != element.id and r in elements})
