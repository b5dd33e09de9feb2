"""Queries over the folded memory elements: an identity's elements, what a decay sweep may
touch, and what depends on what (LIST DEPENDENTS)."""

from __future__ import annotations

from collections.abc import Iterator
from operator import attrgetter

from pulse_core.maintenance._element_state import Element, ElementsState

_CREATED_SEQ = attrgetter("created_seq")


def of_identity(state: ElementsState, identity: str) -> list[Element]:
    """The live elements of `identity`, oldest first."""
    prefix = f"{identity}/"
    found = [e for eid, e in state.elements.items()
             if eid.startswith(prefix) and e.identity == identity]
    return sorted(found, key=lambda e: e.created_seq)


def eligible_for_decay(state: ElementsState, *, cycle_start: int, floor: float,
                       protection: float, limit: int | None = None) -> list[Element]:
    """Active elements a sweep of `cycle_start` may decay: least recently metabolized
    first, then by identity (so a batch touches few identities: one event each).

    Left out: anything not active, retracted, under legal hold, at or below `floor`, with
    salience >= `protection`, already metabolized by this (or a later) cycle, and pending or
    blocked high-impact commitments.
    """
    found, _ = decay_queue(state, cycle_start=cycle_start, floor=floor, protection=protection)
    return found if limit is None else found[:limit]


def decay_queue(state: ElementsState, *, cycle_start: int, floor: float, protection: float
                ) -> tuple[list[Element], int]:
    """eligible_for_decay in its order, and how many elements protection alone kept out of
    it (due for decay but shielded), in one pass."""
    # grouped by stamp, then identity: the order of one sort by (stamp, identity,
    # created_seq) without comparing a tuple per element
    groups: dict[int, dict[str, list[Element]]] = {}
    protected = 0
    for e in state.elements.values():
        if due_for_decay(e, cycle_start, floor):
            if shielded(e, protection):
                protected += 1
                continue
            stamp = e.last_metabolized_at or 0
            by_identity = groups.get(stamp)
            if by_identity is None:
                by_identity = groups[stamp] = {}
            mine = by_identity.get(e.identity)
            if mine is None:
                by_identity[e.identity] = [e]
            else:
                mine.append(e)
    found: list[Element] = []
    for stamp in sorted(groups):
        by_identity = groups[stamp]
        for identity in sorted(by_identity):
            mine = by_identity[identity]
            mine.sort(key=_CREATED_SEQ)
            found.extend(mine)
    return found, protected


def decays(e: Element, cycle_start: int, floor: float, protection: float) -> bool:
    """Whether a sweep of `cycle_start` may decay `e` (see eligible_for_decay)."""
    return due_for_decay(e, cycle_start, floor) and not shielded(e, protection)


def due_for_decay(e: Element, cycle_start: int, floor: float) -> bool:
    """Whether a sweep of `cycle_start` would decay `e` but for protection: active, not
    retracted, above `floor`, and not yet metabolized by this (or a later) cycle."""
    return (e.stage == "active" and not e.retracted and e.strength > floor
            and (e.last_metabolized_at is None or e.last_metabolized_at < cycle_start))


def shielded(e: Element, protection: float) -> bool:
    """Whether `e` resists forgetting: under legal hold, salience at or above `protection`,
    or a pending or blocked high-impact commitment."""
    return e.legal_hold or e.salience >= protection or (
        e.commitment is not None and protected_commitment(e))


def protected_commitment(e: Element) -> bool:
    """A high-impact commitment still pending or blocked: never decayed."""
    c = e.commitment
    return c is not None and c.impact == "high" and c.status in ("pending", "blocked")


def references_of(state: ElementsState, eid: str) -> tuple[str, ...]:
    """The live element ids that cite `eid` (derive from it, correct it, cite it)."""
    element = state.elements.get(eid)
    return element.referenced_by if element is not None else ()


def dependents(state: ElementsState, root: str, *, depth: int = 2, limit: int = 100
               ) -> list[str]:
    """Element ids derived from `root`, breadth first, up to `depth` hops and `limit` ids."""
    return list(_walk(state, root, depth, limit))


def _children(state: ElementsState, eid: str) -> list[str]:
    element = state.elements.get(eid)
    if element is None:  # a forgotten or purged root: its dependents are found by a scan
        return [c for c, e in state.elements.items() if eid in e.derived_from]
    derived = [c for c in element.referenced_by
               if eid in getattr(state.elements.get(c), "derived_from", ())]
    return [*derived, *element.consolidated_to]


def _walk(state: ElementsState, root: str, depth: int, limit: int) -> Iterator[str]:
    seen = {root}
    level = [root]
    count = 0
    for _ in range(max(depth, 0)):
        nxt: list[str] = []
        for eid in level:
            for child in _children(state, eid):
                if child in seen or child not in state.elements:
                    continue
                seen.add(child)
                nxt.append(child)
                yield child
                count += 1
                if count >= limit:
                    return
        level = nxt


def byte_namers(state: ElementsState, digest: str, *, besides: str = "") -> list[str]:
    """What else names the bytes `digest`: live elements other than `besides` (an element
    id) and, as "event on <key>", the first other event of the log carrying that digest (a
    non-element event, a revision's attachment, a forgotten record's replay). Bytes are
    deleted only when this is empty."""
    names = [e for e in state.digests.get(digest, ()) if e != besides]
    if digest in state.foreign:
        names.append(f"event on {state.foreign[digest]}")
    return names
