"""Identity merge: two identities found to be one, without losing either's history.

A merge writes `identity-merged` on the source's key (`identity:<source>`: into, reason,
evidence) and `identity-absorbed` on the target's key, in one append that expects both keys'
versions. Nothing is moved or rewritten: the source's events and records stay readable under
its own key; `canonical(merges, identity)` follows the merges to the identity future writes
should use. A merge that would form a cycle (a self-merge, or A into B while B already
resolves to A) is refused and nothing is written; the `Merges` fold ignores one that slipped
past (two concurrent merges on disjoint keys), so `canonical` always terminates.

A suspicion that two identities are the same is not a merge: it is an `assertion-made` with
slot "same_as" (`suspect_same`), which feeds review and never merges by itself.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from pulse_core._errors import MergeRefused
from pulse_core._events import Event, EventDraft, register_kind
from pulse_core._pmap import PersistentMap
from pulse_core._snapshot import Projection
from pulse_core.maintenance._activities import retry_once
from pulse_core.maintenance._authority import Authority
from pulse_core.maintenance._beliefs import BeliefBoard
from pulse_core.memory import identity_key
from pulse_core.store import EventStore

__all__ = [
    "IdentityAbsorbed",
    "IdentityMerged",
    "MergeLink",
    "MergeRefused",
    "Merges",
    "aliases",
    "canonical",
    "merge_identity",
    "read_merges",
    "suspect_same",
]

READ_ATTEMPTS = 5
"""How often a merge re-reads the merges that changed under it before it gives up."""

SAME_AS = "same_as"
"""The belief slot of a suspicion that the identity is the same as another."""


class IdentityMerged(msgspec.Struct, frozen=True, kw_only=True):
    """identity-merged (on the source's key): this identity is the same as `into`."""

    into: str
    reason: str = ""
    evidence: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.into.strip():
            raise ValueError("a merge needs a target identity (into)")


class IdentityAbsorbed(msgspec.Struct, frozen=True, kw_only=True):
    """identity-absorbed (on the target's key): identity `source` was merged into this one."""

    source: str


register_kind("identity-merged", "this identity was merged into another (non-destructive); "
              "key: identity:<source>", IdentityMerged)
register_kind("identity-absorbed", "another identity was merged into this one; key: "
              "identity:<target>", IdentityAbsorbed)


class MergeLink(msgspec.Struct, frozen=True, gc=False):
    """One honoured merge: `source` into `into`, when (seq, at), by whom and why."""

    source: str
    into: str
    reason: str
    evidence: tuple[str, ...]
    seq: int
    at: int
    by: str


def canonical(merges: Mapping[str, MergeLink], identity: str) -> str:
    """The identity `identity` resolves to through the merges (itself when never merged)."""
    seen = {identity}
    current = identity
    while (link := merges.get(current)) is not None:
        if link.into in seen:  # unreachable through the fold; a guard for a hand-made map
            break
        seen.add(link.into)
        current = link.into
    return current


def aliases(merges: Mapping[str, MergeLink], identity: str) -> tuple[str, ...]:
    """Every identity that resolves where `identity` does (itself and the canonical included),
    sorted: the keys whose histories together tell the identity's story."""
    root = canonical(merges, identity)
    found = {root, identity}
    found.update(s for s in merges if canonical(merges, s) == root)
    return tuple(sorted(found))


def _problem(merges: Mapping[str, MergeLink], source: str, into: str) -> str | None:
    """Why merging `source` into `into` is refused, or None. The fold applies the same."""
    if source == into:
        return f"identity {source!r} cannot be merged into itself"
    if source in merges:
        return (f"identity {source!r} is already merged into {merges[source].into!r} — "
                f"merge {canonical(merges, source)!r} instead")
    if canonical(merges, into) == source:
        return (f"{into!r} already resolves to {source!r}: merging {source!r} into it would "
                f"form a cycle — they are one identity already: write to {source!r}")
    return None


class Merges(Projection[PersistentMap[str, MergeLink]]):
    """Every honoured merge, by source identity."""

    name = "merges"
    kinds = frozenset({"identity-merged"})

    def initial(self) -> PersistentMap[str, MergeLink]:
        return PersistentMap()

    def apply(self, state: PersistentMap[str, MergeLink], event: Event
              ) -> PersistentMap[str, MergeLink]:
        if not event.key.startswith("identity:"):
            return state
        source = event.key.removeprefix("identity:")
        body = event.payload(IdentityMerged)
        if _problem(state, source, body.into) is not None:
            return state
        return state.set(source, MergeLink(source, body.into, body.reason, body.evidence,
                                           event.seq, event.ts, event.origin))


async def read_merges(store: EventStore) -> PersistentMap[str, MergeLink]:
    """The merges as the log holds them now (the Merges fold over every identity-merged)."""
    fold = Merges()
    state = fold.initial()
    for event in await store.read(kinds=Merges.kinds):
        state = fold.apply(state, event)
    return state


def _chain(merges: Mapping[str, MergeLink], identity: str) -> list[str]:
    """`identity` and every identity it resolves through, up to its canonical one."""
    chain = [identity]
    while (link := merges.get(chain[-1])) is not None and link.into not in chain:
        chain.append(link.into)
    return chain


async def _stable_read(store: EventStore, source: str, into: str
                       ) -> tuple[PersistentMap[str, MergeLink], dict[str, int]]:
    """The merges, and the versions to expect: the source's and those of every identity on
    the target's chain. A concurrent merge out of any of them moves its key, so two merges
    that together would close a cycle can never both commit."""
    merges = await read_merges(store)
    for _ in range(READ_ATTEMPTS):
        expect = {identity_key(i): await store.head(identity_key(i))
                  for i in (source, *_chain(merges, into))}
        again = await read_merges(store)
        if again == merges:
            return merges, expect
        merges = again
    raise MergeRefused(source, into, f"merge refused: the merges changed during each of "
                       f"{READ_ATTEMPTS} reads — retry when they settle")


async def merge_identity(store: EventStore, source: str, into: str, *, reason: str,
                         evidence: tuple[str, ...] = (), origin: str = "agent",
                         authority: Authority | None = None, principal: str = ""
                         ) -> tuple[Event, Event]:
    """Merge identity `source` into `into`; returns the (merged, absorbed) events.

    With `authority`, `principal` must hold the "merge" grant (NotAuthorized otherwise).
    MergeRefused for a self-merge, an already merged source or a cycle; nothing is written.
    Both keys' versions are expected at commit, so a concurrent write means a fresh read and
    one retry.
    """
    if not source or not into:
        raise ValueError("merge_identity needs both a source and a target identity")
    if authority is not None:
        if not principal:
            raise ValueError("merge_identity with an authority needs the acting principal")
        await authority.require(principal, "merge", f"merge identity {source!r} into {into!r}")
    merged = msgspec.to_builtins(IdentityMerged(into=into, reason=reason,
                                                evidence=tuple(evidence)))
    absorbed = msgspec.to_builtins(IdentityAbsorbed(source=source))

    async def attempt() -> tuple[Event, Event]:
        merges, expect = await _stable_read(store, source, into)
        problem = _problem(merges, source, into)
        if problem is not None:
            raise MergeRefused(source, into, f"merge refused: {problem}")
        result = await store.append([
            EventDraft("identity-merged", identity_key(source), merged, origin=origin),
            EventDraft("identity-absorbed", identity_key(into), absorbed, origin=origin),
        ], expect=expect)
        return result.events[0], result.events[1]

    return await retry_once(attempt)


async def suspect_same(board: BeliefBoard, identity: str, other: str, *, confidence: float,
                       evidence: tuple[str, ...] = (), reason: str = "",
                       origin: str | None = None) -> Event:
    """Record the suspicion that `identity` is the same as `other`: an inferred assertion on
    slot "same_as", for review. It never merges anything by itself."""
    return await board.assert_(identity, SAME_AS, other, confidence=confidence, mode="inferred",
                               evidence=evidence, reason=reason, origin=origin)
