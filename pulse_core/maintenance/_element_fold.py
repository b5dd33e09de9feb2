"""How one event changes the memory elements (see _elements.py): records created, revised,
removed, purged, laddered, reinforced and metabolized, with their lineage kept acyclic."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from pulse_core._events import Event
from pulse_core._pmap import PersistentMap
from pulse_core.maintenance._authority import HUMAN, rank
from pulse_core.maintenance._element_kinds import INSIGHT_STRENGTH, element_id
from pulse_core.maintenance._element_state import (
    Commitment,
    Element,
    ElementsState,
    live_references,
)

_CREATE_TYPES = {
    "human-exchange": "exchange", "state-set": "state", "unresolved-opened": "unresolved",
    "observation-recorded": "observation", "temporal-fact-recorded": "fact",
    "reflection-recorded": "reflection", "insight-recorded": "insight",
    "commitment-made": "commitment", "assertion-made": "assertion",
}
_REVISING = frozenset({"state-revised", "state-retracted", "unresolved-resolved"})
_REMOVING = frozenset({"record-forgotten", "record-quarantined", "element-purged"})
_LADDER = {"element-archived": ("active", "archived"),
           "element-tombstoned": ("archived", "tombstoned"),
           "element-restored": ("archived", "active")}
_EVIDENCE_FIELDS = ("evidence", "evidence_for", "evidence_against", "supports", "contradicts",
                    "counter_evidence", "against", "cites", "sources")


def _ref(identity: str, value: Any) -> str | None:
    """An element id from a reference: an element id as is, a bare record of `identity`."""
    if not isinstance(value, str) or not value:
        return None
    return value if "/" in value else element_id(identity, value)


def _refs(identity: str, values: Any) -> tuple[str, ...]:
    if isinstance(values, str):
        values = (values,)
    if not isinstance(values, (list, tuple)):
        return ()
    out: list[str] = []
    for item in values:
        value = item.get("element") or item.get("record") if isinstance(item, dict) else item
        ref = _ref(identity, value)
        if ref is not None and ref not in out:
            out.append(ref)
    return tuple(out)


def _initial_salience(kind: str, data: dict[str, Any]) -> float:
    if kind == "state-set" and data.get("protected"):
        return 1.0
    if kind == "observation-recorded":
        return {"critical": 0.9, "warning": 0.6}.get(str(data.get("severity")), 0.0)
    if kind == "commitment-made" and data.get("impact") == "high":
        return 0.9
    if kind == "unresolved-opened" and isinstance(data.get("priority"), int) \
            and data["priority"] >= 5:
        return 0.8
    if kind == "insight-recorded":
        salience = data.get("salience", 0.5)
        return float(salience) if isinstance(salience, (int, float)) else 0.5
    return 0.0


class _Fold:
    """One event applied to an ElementsState (a small mutable builder over immutable maps)."""

    def __init__(self, state: ElementsState) -> None:
        self.elements = state.elements
        self.pending = state.pending
        self.gone = state.purged | state.forgotten

    def get(self, eid: str) -> Element | None:
        return self.elements.get(eid)

    def put(self, element: Element) -> None:
        self.elements = self.elements.set(element.id, element)

    def change(self, eid: str, **changes: Any) -> None:
        element = self.elements.get(eid)
        if element is not None:
            self.put(msgspec.structs.replace(element, **changes))

    def link(self, source: str, targets: Iterable[str]) -> None:
        for target in targets:
            element = self.elements.get(target)
            if element is None and target not in self.gone:  # cited before it was written
                waiting = self.pending.get(target, ())
                if source not in waiting:
                    self.pending = self.pending.set(target, (*waiting, source))
            if element is not None and source not in element.referenced_by:
                self.put(msgspec.structs.replace(
                    element, referenced_by=(*element.referenced_by, source)))

    def unlink(self, source: Element) -> None:
        for target in (*source.references, *source.consolidated_to):
            element = self.elements.get(target)
            if element is None:
                continue
            self.put(msgspec.structs.replace(
                element, referenced_by=tuple(r for r in element.referenced_by if r != source.id),
                consolidated_to=tuple(c for c in element.consolidated_to if c != source.id)))


def _fold(state: ElementsState, event: Event) -> ElementsState:
    after = _fold_event(state, event)
    digest = event.hash
    if digest is None or digest in after.foreign:
        return after
    created = after.elements.get(_created_id(event))
    if created is not None and created.created_seq == event.seq:
        return after  # the creation of a live element: counted in `digests`
    return msgspec.structs.replace(after, foreign=after.foreign.set(digest, event.key))


def _created_id(event: Event) -> str:
    record = event.data.get("record") if isinstance(event.data, dict) else None
    return element_id(event.key.removeprefix("identity:"), record) \
        if isinstance(record, str) else ""


def _purge_payload(state: ElementsState, event: Event) -> ElementsState:
    """payload-purged (keyed by the digest): ignored while a held element names the bytes."""
    replace = msgspec.structs.replace
    digest = event.key
    f = _Fold(state)
    sharers = [e for e in state.digests.get(digest, ()) if e in f.elements]
    if any(f.elements[e].legal_hold for e in sharers):
        return replace(state, seq=event.seq)
    for eid in sharers:
        f.change(eid, payload_purged=True)
    return replace(state, elements=f.elements, seq=event.seq,
                   payloads_purged=state.payloads_purged | {digest})


def _purgeable(elements: PersistentMap[str, Element], element: Element | None) -> bool:
    return (element is not None and element.stage in ("archived", "tombstoned")
            and not element.legal_hold and not live_references(elements, element))


def _fold_event(state: ElementsState, event: Event) -> ElementsState:
    replace = msgspec.structs.replace
    if not event.key.startswith("identity:"):
        if event.kind == "payload-purged":
            return _purge_payload(state, event)
        return state if event.seq <= state.seq else replace(state, seq=event.seq)
    identity = event.key.removeprefix("identity:")
    state = replace(state, versions=state.versions.set(identity, event.version), seq=event.seq)
    data = event.data if isinstance(event.data, dict) else {}
    kind = event.kind
    f = _Fold(state)
    if kind == "element-consolidated":
        to = _ref(identity, data.get("to"))
        for eid in _refs(identity, data.get("records")):
            element = f.get(eid)
            if to is not None and element is not None and to not in element.consolidated_to:
                f.put(replace(element, consolidated_to=(*element.consolidated_to, to),
                              updated_seq=event.seq))
        return replace(state, elements=f.elements)
    record = data.get("record")
    if not isinstance(record, str) or not record:
        return state
    eid = element_id(identity, record)
    if eid in state.purged or eid in state.forgotten:
        return state  # a forgotten or purged record never comes back
    element = f.get(eid)
    if kind == "element-purged" and not _purgeable(f.elements, element):
        return state  # the fold re-checks the purge: never an active, held or cited element
    if kind in _REMOVING:
        digests = state.digests
        if element is not None:
            f.unlink(element)
            f.elements = f.elements.delete(eid)
            if element.digest is not None:
                left = tuple(e for e in digests.get(element.digest, ()) if e != eid)
                digests = digests.set(element.digest, left) if left \
                    else digests.delete(element.digest)
        gone = {eid}
        if kind == "element-purged":
            return replace(state, elements=f.elements, purged=state.purged | gone,
                           digests=digests)
        return replace(state, elements=f.elements, forgotten=state.forgotten | gone,
                       digests=digests)
    if kind in _CREATE_TYPES:
        if element is not None:  # a record written again (state re-set): a revision
            f.put(replace(element, revised_seq=event.seq, retracted=False,
                          updated_seq=event.seq))
            return replace(state, elements=f.elements)
        element = _create(identity, record, kind, data, event)
        element = _without_cycles(f, element)
        waiting = tuple(s for s in f.pending.get(eid, ()) if s in f.elements)
        if waiting:
            element = replace(element, referenced_by=waiting)
            f.pending = f.pending.delete(eid)
        f.put(element)
        f.link(eid, element.references)
        digests = state.digests
        purged_payloads = state.payloads_purged
        if element.digest is not None:
            digests = digests.set(element.digest,
                                  (*digests.get(element.digest, ()), eid))
            purged_payloads = purged_payloads - {element.digest}  # the bytes were put again
        return replace(state, elements=f.elements, digests=digests, pending=f.pending,
                       payloads_purged=purged_payloads)
    if element is None:
        return state
    _update(f, element, kind, data, event)
    return replace(state, elements=f.elements, pending=f.pending)


def _without_cycles(f: _Fold, element: Element) -> Element:
    """`element` citing neither itself nor an element that already cites it (a two-cycle:
    the older citation stands)."""
    drop = {r for r in element.references
            if r == element.id or element.id in getattr(f.get(r), "references", ())}
    if not drop:
        return element
    return msgspec.structs.replace(
        element, references=tuple(r for r in element.references if r not in drop),
        derived_from=tuple(r for r in element.derived_from if r not in drop))


def _create(identity: str, record: str, kind: str, data: dict[str, Any], event: Event
            ) -> Element:
    eid = element_id(identity, record)
    derived: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    commitment = None
    if kind == "insight-recorded":
        derived = _refs(identity, data.get("derived_from"))
        references = derived
    elif kind == "assertion-made":
        cited: list[str] = []
        for name in _EVIDENCE_FIELDS:
            cited.extend(r for r in _refs(identity, data.get(name)) if r not in cited)
        references = tuple(r for r in cited if r != eid)
    elif kind == "commitment-made":
        due = data.get("due_at")
        commitment = Commitment(str(data.get("text", "")), due if isinstance(due, int) else None,
                                str(data.get("impact", "normal")), "pending", event.ts)
    return Element(
        eid, identity, record, _CREATE_TYPES[kind], event.ts, event.seq, event.origin,
        strength=INSIGHT_STRENGTH if kind == "insight-recorded" else 1.0,
        salience=_initial_salience(kind, data), derived_from=derived, digest=event.hash,
        references=references, commitment=commitment, updated_seq=event.seq)


def _update(f: _Fold, element: Element, kind: str, data: dict[str, Any], event: Event
            ) -> None:
    replace = msgspec.structs.replace
    seq = event.seq
    if kind in _REVISING:
        f.put(replace(element, revised_seq=seq, retracted=kind != "state-revised",
                      updated_seq=seq))
    elif kind == "memory-reinforced":
        f.put(replace(element, strength=float(data.get("strength", element.strength)),
                      updated_seq=seq))
    elif kind == "salience-set":
        f.put(replace(element, salience=float(data.get("salience", element.salience)),
                      updated_seq=seq))
    elif kind in _LADDER:
        before, after = _LADDER[kind]
        if element.stage == before:  # any other step is not the ladder's: ignored
            f.put(replace(element, stage=after, updated_seq=seq))
    elif kind == "legal-hold-set":
        f.put(replace(element, legal_hold=True, updated_seq=seq))
    elif kind == "legal-hold-released":
        if rank(event.origin) == HUMAN:  # only a human lifts a hold, however it was written
            f.put(replace(element, legal_hold=False, updated_seq=seq))
    elif kind == "derivation-stale":
        root = str(data.get("root", ""))
        roots = element.stale_roots if root in element.stale_roots \
            else (*element.stale_roots, root)
        f.put(replace(element, stale=True, stale_roots=roots, updated_seq=seq))
    elif kind == "derivation-reviewed":
        f.put(replace(element, stale=False, stale_roots=(), updated_seq=seq))
    elif kind == "evidence-corrected":
        by = _ref(element.identity, data.get("by"))
        if by is None or by == element.id or f.get(by) is None:
            return  # a correction by nothing, or by itself, corrects nothing
        f.put(replace(element, corrected_by=by, revised_seq=seq, updated_seq=seq))
        fixer = f.get(by) if by is not None else None
        if fixer is not None and by is not None:
            f.put(replace(fixer, corrects=element.id,
                          references=(*fixer.references, element.id)
                          if element.id not in fixer.references else fixer.references,
                          updated_seq=seq))
            f.link(by, (element.id,))
    elif kind == "commitment-updated" and element.commitment is not None:
        f.put(replace(element, commitment=replace(
            element.commitment, status=str(data.get("status", element.commitment.status)),
            updated_at=event.ts), updated_seq=seq))


def fold_event(state: ElementsState, event: Event) -> ElementsState:
    """The elements state after `event` (pure: `state` is not changed)."""
    return fold_events(state, (event,))


def fold_events(state: ElementsState, events: Iterable[Event]) -> ElementsState:
    """The elements state after `events`, in order (pure): fold_event of each, but a run of
    sweep events (`memory-metabolized`, a page of them after a sweep) reaches the maps in
    one update, so each bucket of a large memory is copied once per run, not per event."""
    changed: dict[str, Element] = {}
    versions: dict[str, int] = {}
    seq = state.seq
    for event in events:
        strengths = _swept(event)
        if strengths is None:
            if versions:
                state = _settle(state, changed, versions, seq)
                changed, versions = {}, {}
            state = _fold(state, event)
            continue
        identity = event.key.removeprefix("identity:")
        _metabolize(state.elements, changed, identity, event, strengths)
        versions[identity] = event.version
        seq = event.seq
    return _settle(state, changed, versions, seq) if versions else state


def _swept(event: Event) -> dict[str, Any] | None:
    """The strengths of a sweep's event, or None for any other event (folded by _fold: a
    metabolized event with a digest, or without strengths, moves only the version and seq)."""
    if event.kind != "memory-metabolized" or event.hash is not None \
            or not event.key.startswith("identity:") or not isinstance(event.data, dict):
        return None
    strengths = event.data.get("strengths")
    return strengths if isinstance(strengths, dict) else None


def _metabolize(elements: PersistentMap[str, Element], changed: dict[str, Element],
                identity: str, event: Event, strengths: dict[str, Any]) -> None:
    """Put into `changed` the elements of `identity` whose strength `event` sets. A run of
    sweep events changes nothing else, and each sets all three fields: an element's form
    before the run (in `elements`) is as good a start as its newest."""
    cycle = event.data.get("cycle_start")
    # a stamp from the future would freeze the element (never "due" again): clamp it
    stamp = min(cycle, event.ts) if isinstance(cycle, int) else None
    replace = msgspec.structs.replace
    seq = event.seq
    prefix = element_id(identity, "")
    for record, strength in strengths.items():
        if not isinstance(strength, (int, float)) or not 0.0 <= strength <= 1.0:
            continue
        element = elements.get(f"{prefix}{record}")
        if element is not None:
            changed[element.id] = replace(element, strength=float(strength),
                                          last_metabolized_at=stamp, updated_seq=seq)


def _settle(state: ElementsState, changed: dict[str, Element], versions: dict[str, int],
            seq: int) -> ElementsState:
    """`state` with a run of sweep events' elements and versions, at `seq`."""
    return msgspec.structs.replace(state, elements=state.elements.update(changed),
                                   versions=state.versions.update(versions), seq=seq)
