"""Beliefs: assertions about an identity, with room for disagreement.

A state item holds one value; a belief slot ("timezone") holds every assertion made about
it, each by its actor (the origin of its `assertion-made` event), with its confidence, mode,
valid time and evidence. Disagreement is kept, never resolved by overwriting:

- different actors' assertions coexist (both active: the slot is *contested*, a finding for
  review, not a defect);
- only the same actor's explicit revision (`supersedes=`) supersedes its own earlier claim
  (the earlier one was wrong); a claim on another actor's assertion is refused at write time
  and ignored by the fold;
- a claim that was true and stopped being true is *closed* (`assertion-closed` sets its
  valid_until), never superseded;
- assertions with different valid times coexist.

Nothing is deleted or quarantined because of a contradiction, and an assertion's confidence
never changes: a new epistemic fact is a new assertion. All events are keyed
`identity:<id>`, so one expected version guards an identity's beliefs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import msgspec

from pulse_core._errors import RevisionRefused
from pulse_core._events import Event, EventDraft, register_kind, uuid7
from pulse_core._pmap import PersistentMap
from pulse_core._snapshot import Projection
from pulse_core.maintenance._activities import retry_once
from pulse_core.memory import identity_key
from pulse_core.store import EventStore

__all__ = [
    "Assertion",
    "AssertionClosed",
    "AssertionMade",
    "BeliefBoard",
    "Beliefs",
    "IdentityBeliefs",
    "RevisionRefused",
    "believe",
    "classify",
    "contested",
]

MODES = ("stated", "inferred")
ACTIVE, SUPERSEDED, CLOSED = "active", "superseded", "closed"
CLASSES = ("same-actor-revision", "agreement", "different-valid-times", "source-correction",
           "different-actors")
"""What `classify` answers, in the order it decides them."""

REMOVING = frozenset({"record-forgotten", "record-quarantined", "element-purged"})
"""Kinds that take a record out of the current form for good (memory and retention own them);
an assertion they name leaves its slot and its record id never comes back."""


def _check_interval(valid_from: int | None, valid_until: int | None) -> None:
    if valid_from is not None and valid_until is not None and valid_until < valid_from:
        raise ValueError(f"valid_until {valid_until} is before valid_from {valid_from}")


class AssertionMade(msgspec.Struct, frozen=True, kw_only=True):
    """assertion-made: an actor's claim that `slot` of the identity has `value`.

    `evidence` holds element ids ("<identity>/<record>") the claim rests on; `supersedes` an
    earlier assertion of the same actor that was wrong.
    """

    record: str
    slot: str
    value: Any
    confidence: float = 1.0
    mode: str = "stated"
    valid_from: int | None = None
    valid_until: int | None = None
    evidence: tuple[str, ...] = ()
    supersedes: str | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if not self.record.startswith("a-"):
            raise ValueError(f"assertion record {self.record!r} must start with 'a-'")
        if not self.slot.strip():
            raise ValueError("an assertion needs a slot (what it is about)")
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence {self.confidence} is outside 0..1")
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {MODES}")
        _check_interval(self.valid_from, self.valid_until)
        for ref in self.evidence:
            head, _, tail = ref.rpartition("/")
            if not head or not tail:
                raise ValueError(f"evidence {ref!r} is not an element id '<identity>/<record>'")


class AssertionClosed(msgspec.Struct, frozen=True, kw_only=True):
    """assertion-closed: the claim `record` was true and stopped being true at valid_until."""

    record: str
    valid_until: int
    reason: str = ""


register_kind("assertion-made", "an actor's claim about a slot of the identity; key: "
              "identity:<id>", AssertionMade)
register_kind("assertion-closed", "a claim that was true stopped being true (valid_until set); "
              "key: identity:<id>", AssertionClosed)

BELIEF_KINDS = frozenset({"assertion-made", "assertion-closed"}) | REMOVING


class Assertion(msgspec.Struct, frozen=True, gc=False):
    """One assertion as the fold holds it. `actor` is its event's origin; `supersedes` is set
    only when the revision was honoured (`ignored_supersedes` keeps a refused attempt)."""

    record: str
    identity: str
    slot: str
    value: Any
    confidence: float
    mode: str
    actor: str
    asserted_at: int
    seq: int
    valid_from: int | None = None
    valid_until: int | None = None
    evidence: tuple[str, ...] = ()
    supersedes: str | None = None
    superseded_by: str | None = None
    status: str = ACTIVE
    reason: str = ""
    closed_reason: str = ""
    ignored_supersedes: str | None = None

    @property
    def id(self) -> str:
        """The element id, "<identity>/<record>"."""
        return f"{self.identity}/{self.record}"


class IdentityBeliefs(msgspec.Struct, frozen=True):
    """Every assertion about one identity, by slot (oldest first), minus removed records."""

    identity: str
    slots: dict[str, tuple[Assertion, ...]] = {}
    where: dict[str, str] = {}  # assertion record -> its slot
    removed: frozenset[str] = frozenset()

    def assertion(self, record: str) -> Assertion | None:
        """The assertion `record`, or None."""
        slot = self.where.get(record)
        if slot is None:
            return None
        return next(a for a in self.slots[slot] if a.record == record)

    def active(self, slot: str) -> tuple[Assertion, ...]:
        """The assertions of `slot` still active (neither superseded nor closed)."""
        return tuple(a for a in self.slots.get(slot, ()) if a.status == ACTIVE)


def _replace_in(beliefs: IdentityBeliefs, new: Assertion) -> dict[str, tuple[Assertion, ...]]:
    slot = tuple(new if a.record == new.record else a for a in beliefs.slots[new.slot])
    return {**beliefs.slots, new.slot: slot}


def revision_problem(beliefs: IdentityBeliefs, target: str, actor: str, slot: str | None,
                     until: int | None = None) -> str | None:
    """Why `actor` may not supersede (with an assertion about `slot`) or, when `slot` is
    None, close (at `until`) assertion `target`; None when it may. The fold and the board
    apply this one rule."""
    old = beliefs.assertion(target)
    if old is None:
        return f"identity {beliefs.identity!r} has no assertion {target!r}"
    if old.actor != actor:
        return (f"assertion {target!r} was made by {old.actor!r}, not {actor!r}: an actor "
                "revises only its own claims — assert your own value beside it instead")
    if slot is not None and old.slot != slot:
        return f"assertion {target!r} is about slot {old.slot!r}, not {slot!r}"
    if old.status == SUPERSEDED:
        return (f"assertion {target!r} is already superseded by {old.superseded_by!r} — "
                "revise that one instead")
    if slot is None and old.status == CLOSED:
        return f"assertion {target!r} is already closed at {old.valid_until}"
    if until is not None and old.valid_from is not None and until < old.valid_from:
        return f"valid_until {until} is before assertion {target!r}'s valid_from {old.valid_from}"
    return None


def believe(beliefs: IdentityBeliefs | None, event: Event) -> IdentityBeliefs:
    """The identity's beliefs after `event` (pure: `beliefs` is not changed)."""
    cur = beliefs or IdentityBeliefs(event.key.removeprefix("identity:"))
    data = event.data if isinstance(event.data, dict) else {}
    record = str(data.get("record", ""))
    replace = msgspec.structs.replace
    if event.kind in REMOVING:
        slot = cur.where.get(record)
        if slot is None:  # an assertion id removed before it arrives never arrives either
            return replace(cur, removed=cur.removed | {record}) if record.startswith("a-") \
                else cur
        return replace(cur, removed=cur.removed | {record},
                       where={r: s for r, s in cur.where.items() if r != record},
                       slots={**cur.slots, slot: tuple(
                           a for a in cur.slots[slot] if a.record != record)})
    if event.kind == "assertion-made":
        if record in cur.where or record in cur.removed:
            return cur  # an assertion id is written once; a removed one never comes back
        made = event.payload(AssertionMade)
        new = Assertion(made.record, cur.identity, made.slot, made.value, made.confidence,
                        made.mode, event.origin, event.ts, event.seq, made.valid_from,
                        made.valid_until, made.evidence, reason=made.reason)
        slots = cur.slots
        if made.supersedes is not None:
            if revision_problem(cur, made.supersedes, event.origin, made.slot) is None:
                old = cur.assertion(made.supersedes)
                assert old is not None
                slots = _replace_in(cur, replace(old, status=SUPERSEDED,
                                                 superseded_by=made.record))
                new = replace(new, supersedes=made.supersedes)
            else:
                new = replace(new, ignored_supersedes=made.supersedes)
        return replace(cur, slots={**slots, made.slot: (*slots.get(made.slot, ()), new)},
                       where={**cur.where, made.record: made.slot})
    if event.kind == "assertion-closed":
        closed = event.payload(AssertionClosed)
        old = cur.assertion(closed.record)
        if old is None or revision_problem(cur, closed.record, event.origin, None,
                                           closed.valid_until) is not None:
            return cur
        return replace(cur, slots=_replace_in(cur, replace(
            old, status=CLOSED, valid_until=closed.valid_until, closed_reason=closed.reason)))
    return cur


class Beliefs(Projection[PersistentMap[str, IdentityBeliefs]]):
    """Every identity's assertions by slot, with their status (active|superseded|closed)."""

    name = "beliefs"
    kinds = BELIEF_KINDS

    def initial(self) -> PersistentMap[str, IdentityBeliefs]:
        return PersistentMap()

    def apply(self, state: PersistentMap[str, IdentityBeliefs], event: Event
              ) -> PersistentMap[str, IdentityBeliefs]:
        if not event.key.startswith("identity:"):
            return state
        identity = event.key.removeprefix("identity:")
        if event.kind in REMOVING and identity not in state and not (
                isinstance(event.data, dict) and str(event.data.get("record")).startswith("a-")):
            return state
        return state.set(identity, believe(state.get(identity), event))


def _overlap(a: Assertion, b: Assertion) -> bool:
    """Whether the valid times [from, until) of `a` and `b` share an instant (None: open)."""
    a_starts_before_b_ends = a.valid_from is None or b.valid_until is None or \
        a.valid_from < b.valid_until
    b_starts_before_a_ends = b.valid_from is None or a.valid_until is None or \
        b.valid_from < a.valid_until
    return a_starts_before_b_ends and b_starts_before_a_ends


def classify(a: Assertion, b: Assertion, corrected: Collection[str] = ()) -> str:
    """What kind of (dis)agreement two assertions about the same slot are.

    "same-actor-revision" (one supersedes the other, or one actor changed its value),
    "agreement" (same value), "different-valid-times" (no instant in common),
    "source-correction" (one rests on evidence that was corrected, the other does not:
    `corrected` holds the corrected element ids, e.g. from `evidence-corrected` events),
    or "different-actors". Decided in that order.
    """
    if (a.identity, a.slot) != (b.identity, b.slot):
        raise ValueError(f"{a.id} is about {a.identity}/{a.slot} and {b.id} about "
                         f"{b.identity}/{b.slot}: classify compares claims about one slot")
    if b.supersedes == a.record or a.supersedes == b.record:
        return "same-actor-revision"
    if a.value == b.value:
        return "agreement"
    if not _overlap(a, b):
        return "different-valid-times"
    a_corrected = any(ref in corrected for ref in a.evidence)
    b_corrected = any(ref in corrected for ref in b.evidence)
    if a_corrected != b_corrected:
        return "source-correction"
    return "different-actors" if a.actor != b.actor else "same-actor-revision"


def contested(state: Mapping[str, IdentityBeliefs], corrected: Collection[str] = ()
              ) -> list[tuple[str, str]]:
    """The (identity, slot) pairs where two actors' live claims (active or closed, not
    superseded) disagree at a common valid time: findings for review, sorted."""
    found: list[tuple[str, str]] = []
    for identity, beliefs in state.items():
        for slot, assertions in beliefs.slots.items():
            live = [a for a in assertions if a.status != SUPERSEDED]
            if any(classify(a, b, corrected) == "different-actors"
                   for i, a in enumerate(live) for b in live[i + 1:]):
                found.append((identity, slot))
    return sorted(found)


class BeliefBoard:
    """Writes assertions; each write is checked against the identity's beliefs as the log
    holds them at commit time (expected version of `identity:<id>`)."""

    def __init__(self, store: EventStore, origin: str = "agent") -> None:
        self.store = store
        self.origin = origin

    async def read(self, identity: str) -> tuple[IdentityBeliefs, int]:
        """The identity's beliefs folded from the log, and its key's version they rest on."""
        key = identity_key(identity)
        version = await self.store.head(key)
        beliefs = IdentityBeliefs(identity)
        for event in await self.store.read(key=key, kinds=BELIEF_KINDS):
            beliefs = believe(beliefs, event)
        return beliefs, version

    async def assert_(self, identity: str, slot: str, value: Any, *, confidence: float = 1.0,
                      mode: str = "stated", valid_from: int | None = None,
                      valid_until: int | None = None, evidence: tuple[str, ...] = (),
                      supersedes: str | None = None, reason: str = "",
                      origin: str | None = None) -> Event:
        """Assert `slot` = `value` for `identity` as `origin` (default: the board's).

        RevisionRefused when `supersedes` names an assertion this actor may not supersede
        (another actor's, unknown, another slot, already superseded).
        """
        actor = origin or self.origin
        body = AssertionMade(
            record=f"a-{uuid7()}", slot=slot, value=value, confidence=confidence, mode=mode,
            valid_from=valid_from, valid_until=valid_until, evidence=tuple(evidence),
            supersedes=supersedes, reason=reason)
        return await self._write(identity, body, actor)

    async def close(self, identity: str, record: str, valid_until: int, *, reason: str = "",
                    origin: str | None = None) -> Event:
        """Close the actor's own active assertion `record`: true until `valid_until`.

        RevisionRefused for another actor's, an unknown, a superseded or a closed assertion.
        """
        actor = origin or self.origin
        body = AssertionClosed(record=record, valid_until=valid_until, reason=reason)
        return await self._write(identity, body, actor)

    async def _write(self, identity: str, body: AssertionMade | AssertionClosed, actor: str
                     ) -> Event:
        if isinstance(body, AssertionMade):
            kind, verb, target, slot, until = ("assertion-made", "supersede", body.supersedes,
                                               body.slot, None)
        else:
            kind, verb, target, slot, until = ("assertion-closed", "close", body.record, None,
                                               body.valid_until)
        key = identity_key(identity)

        async def attempt() -> Event:
            beliefs, version = await self.read(identity)
            if target is not None:
                problem = revision_problem(beliefs, target, actor, slot, until)
                if problem is not None:
                    raise RevisionRefused(identity, target, f"cannot {verb}: {problem}")
            draft = EventDraft(kind, key, msgspec.to_builtins(body), origin=actor)
            return (await self.store.append([draft], expect={key: version})).events[0]

        return await retry_once(attempt)
