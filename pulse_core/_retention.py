"""The retention ladder: active -> archived -> tombstoned -> (exceptionally) purged.

Archive and tombstone keep the record: both are storage states, never retraction or
falsehood (the Memory projection still holds the record). Purge removes it from every
current form for good and is exceptional: it needs the `purge` grant, no legal hold, no
live element that derives from it, corrects it or cites it, and a confirmation repeating
the element id; any refusal writes nothing. A payload purge deletes only the attachment's
bytes and keeps the event, its digest and its role as evidence.

Evidence is corrected, never overwritten: `correct` links the old record to the new one
(both stay) and flags what was derived from the old one as stale. Stale is a review flag:
it never retracts, hides or archives anything.

Every action is one append holding its change and an activity that records it, guarded by
the identity's expected version (re-read, re-evaluate and retry once on a conflict).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from pulse_core._activities import ActivityBody, activity_draft, activity_key, retry_once
from pulse_core._authority import HUMAN, Authority, rank
from pulse_core._clock import Clock, SystemClock
from pulse_core._element_kinds import Correction, StageChange, Stale, element_id, split_element_id
from pulse_core._element_queries import dependents
from pulse_core._elements import Element, ElementsReader, ElementsState
from pulse_core._errors import InvalidTransition, NotAuthorized, PurgeRefused
from pulse_core._events import Event, EventDraft, uuid7
from pulse_core.memory import identity_key
from pulse_core.store._base import EventStore
from pulse_core.store._objects import ObjectStore, purge_payload

__all__ = ["RetentionLadder"]

Check = Callable[[Element, ElementsState], None]


def _stage(*allowed: str, action: str) -> Check:
    def check(element: Element, state: ElementsState) -> None:
        if element.stage not in allowed:
            raise InvalidTransition(
                f"cannot {action} {element.id!r}: it is {element.stage}, and only "
                f"{' or '.join(allowed)} elements can be — see docs/metabolism.md")
    return check


class RetentionLadder:
    """Retention actions of `principal` over the elements, each checked against its grants
    (read afresh at every action) and written with origin `origin`."""

    def __init__(self, store: EventStore, reader: ElementsReader, authority: Authority,
                 principal: str, *, origin: str, objects: ObjectStore | None = None,
                 clock: Clock | None = None) -> None:
        self.store = store
        self.reader = reader
        self.authority = authority
        self.principal = principal
        self.origin = origin
        self.objects = objects if objects is not None else store.objects
        self.clock = clock or SystemClock()

    # -- the ladder ------------------------------------------------------------------------

    async def archive(self, eid: str, reason: str = "") -> Event:
        """active -> archived: out of decay and ordinary recall, still readable and true."""
        await self.authority.require(self.principal, "archive", f"archive {eid!r}")
        return await self._step(eid, "element-archived", "archive", reason,
                                _stage("active", action="archive"))

    async def restore(self, eid: str, reason: str = "") -> Event:
        """archived -> active."""
        await self.authority.require(self.principal, "archive", f"restore {eid!r}")
        return await self._step(eid, "element-restored", "archive", reason,
                                _stage("archived", action="restore"))

    async def tombstone(self, eid: str, reason: str = "") -> Event:
        """archived -> tombstoned: logically deleted, the record and its id kept for audit."""
        await self.authority.require(self.principal, "retention", f"tombstone {eid!r}")
        return await self._step(eid, "element-tombstoned", "tombstone", reason,
                                _stage("archived", action="tombstone"))

    async def set_hold(self, eid: str, reason: str = "") -> Event:
        """Put `eid` under legal hold: never purged (element or payload), never decayed."""
        await self.authority.require(self.principal, "retention", f"hold {eid!r}")

        def check(element: Element, state: ElementsState) -> None:
            if element.legal_hold:
                raise InvalidTransition(f"{eid!r} is already under legal hold")
        return await self._step(eid, "legal-hold-set", "legal_hold", reason, check)

    async def release_hold(self, eid: str, reason: str = "") -> Event:
        """Release a legal hold: needs the `retention` grant and a human origin (a hold is
        placed for reasons outside the machine; a background writer never lifts one)."""
        await self.authority.require(self.principal, "retention", f"release the hold on "
                                                                  f"{eid!r}")
        if rank(self.origin) != HUMAN:
            raise NotAuthorized(self.principal, "retention", (
                f"{self.origin!r} may not release the legal hold on {eid!r}: only a human "
                "origin ('human:<who>') releases a hold"))

        def check(element: Element, state: ElementsState) -> None:
            if not element.legal_hold:
                raise InvalidTransition(f"{eid!r} is not under legal hold")
        return await self._step(eid, "legal-hold-released", "legal_hold", reason, check)

    async def purge(self, eid: str, *, confirm: str, reason: str = "") -> Event:
        """Remove an archived or tombstoned element for good (`element-purged`): the Memory
        projection drops the record like a forgotten one and it is never evidence again. Its
        attachment bytes go too unless another live element names the same digest.

        Refused (PurgeRefused, nothing written) when `confirm` is not `eid`, when the element
        is active, under legal hold, or referenced by a live element."""
        await self.authority.require(self.principal, "purge", f"purge {eid!r}")
        if confirm != eid:
            raise PurgeRefused(f"purge of {eid!r} not confirmed: pass confirm={eid!r} "
                               f"(got {confirm!r})")

        digests: list[str | None] = []

        def check(element: Element, state: ElementsState) -> None:
            _purgeable(element, state, payload=False)
            digests.append(element.digest)
        event = await self._step(eid, "element-purged", "purge", reason, check,
                                 activity=f"purge:{eid}")
        digest = digests[-1]
        state = await self.reader.current()
        if digest is not None and self.objects is not None \
                and not state.digests.get(digest, ()) and self.objects.exists(digest):
            await purge_payload(self.store, self.objects, digest, reason=reason or "purge",
                                origin=self.origin)
        return event

    async def purge_payload(self, eid: str, *, confirm: str, reason: str = "") -> Event:
        """Delete the bytes of `eid`'s attachment; the event, its digest and the element stay
        (payload_purged set). Needs the purge grant, the confirmation and no legal hold."""
        await self.authority.require(self.principal, "purge", f"purge the payload of {eid!r}")
        if confirm != eid:
            raise PurgeRefused(f"payload purge of {eid!r} not confirmed: pass "
                               f"confirm={eid!r} (got {confirm!r})")
        if self.objects is None:
            raise InvalidTransition("no object store: open the store with objects= or pass "
                                    "objects= to the RetentionLadder")
        objects = self.objects

        async def attempt() -> Event:
            state = await self.reader.current()
            element = _live(state, eid)
            _purgeable(element, state, payload=True)
            digest = element.digest
            assert digest is not None
            objects.path_of(digest)
            data = {"reason": reason or "payload purge"}
            drafts = [EventDraft("payload-purged", digest, data, origin=self.origin,
                                 idem=f"payload-purged:{digest}"),
                      self._activity(f"payload-purge-{uuid7()}", "payload_purge", (eid,),
                                     {"digest": digest, "reason": reason})]
            await self.store.append(drafts, expect=_expect(state, element.identity))
            return await purge_payload(self.store, objects, digest, reason=data["reason"],
                                       origin=self.origin)

        return await retry_once(attempt)

    # -- correction and derivation review ----------------------------------------------------

    async def correct(self, identity: str, old_record: str, new_record: str,
                      reason: str = "", *, depth: int = 2, limit: int = 100) -> list[str]:
        """Record that `new_record` corrects `old_record` (`evidence-corrected`): both stay,
        linked both ways; what derives from the old one is flagged stale in the same append.
        Returns the ids flagged stale. Needs the `maintain` grant."""
        old, new = element_id(identity, old_record), element_id(identity, new_record)
        await self.authority.require(self.principal, "maintain", f"correct {old!r}")

        async def attempt() -> list[str]:
            state = await self.reader.current()
            before = _live(state, old)
            _live(state, new)
            if old == new:
                raise InvalidTransition(f"{old!r} cannot correct itself")
            if before.corrected_by is not None:
                raise InvalidTransition(f"{old!r} is already corrected by "
                                        f"{before.corrected_by!r}: correct that one instead")
            body = Correction(record=old_record, by=new_record, reason=reason)
            drafts = [EventDraft("evidence-corrected", identity_key(identity),
                                 msgspec.to_builtins(body), origin=self.origin)]
            flagged, stale = self._stale_drafts(state, old, depth, limit, "evidence corrected")
            identities = {identity} | {split_element_id(e)[0] for e in flagged}
            drafts += [*stale, self._activity(f"correction-{uuid7()}", "evidence_correction",
                                              (old, new), {"reason": reason,
                                                           "stale": flagged})]
            await self.store.append(drafts, expect=_expect(state, *identities))
            return flagged

        return await retry_once(attempt)

    async def mark_stale(self, root: str, *, depth: int = 2, limit: int = 100,
                         reason: str = "root revised") -> list[str]:
        """Flag the dependents of `root` (depth- and count-bounded) with `derivation-stale`;
        returns the ids newly flagged ([] and nothing written when there are none). Stale
        is a review flag only. Needs the `maintain` grant."""
        await self.authority.require(self.principal, "maintain", f"review {root!r}")

        async def attempt() -> list[str]:
            state = await self.reader.current()
            flagged, drafts = self._stale_drafts(state, root, depth, limit, reason)
            if not flagged:
                return []
            identities = {split_element_id(e)[0] for e in flagged}
            drafts.append(self._activity(f"derivation-review-{uuid7()}", "derivation_review",
                                         (root,), {"stale": flagged, "reason": reason}))
            await self.store.append(drafts, expect=_expect(state, *identities))
            return flagged

        return await retry_once(attempt)

    async def clear_stale(self, eid: str, reason: str = "reviewed") -> Event:
        """Clear `eid`'s stale flag after its review (`derivation-reviewed`); a later
        revision of a root flags it again. Needs the `maintain` grant."""
        await self.authority.require(self.principal, "maintain", f"clear the stale flag of "
                                                                 f"{eid!r}")

        def check(element: Element, state: ElementsState) -> None:
            if not element.stale:
                raise InvalidTransition(f"{eid!r} is not flagged stale")
        return await self._step(eid, "derivation-reviewed", "derivation_review", reason, check)

    # -- plumbing --------------------------------------------------------------------------

    def _stale_drafts(self, state: ElementsState, root: str, depth: int, limit: int,
                      reason: str) -> tuple[list[str], list[EventDraft]]:
        flagged: list[str] = []
        drafts: list[EventDraft] = []
        for eid in dependents(state, root, depth=depth, limit=limit):
            element = state.elements[eid]
            if root in element.stale_roots:
                continue
            flagged.append(eid)
            body = Stale(record=element.record, root=root, reason=reason)
            drafts.append(EventDraft("derivation-stale", identity_key(element.identity),
                                     msgspec.to_builtins(body), origin=self.origin))
        return flagged, drafts

    def _activity(self, activity_id: str, activity_class: str, inputs: Sequence[str],
                  report: object) -> EventDraft:
        now = self.clock.now_ms()
        body = ActivityBody(activity_class=activity_class, actors=(self.principal,),
                            inputs=tuple(inputs), outputs=tuple(inputs), started_at=now,
                            ended_at=now, report=report)
        return activity_draft(activity_id, body, origin=self.origin)

    async def _step(self, eid: str, kind: str, activity_class: str, reason: str,
                    check: Check, *, activity: str | None = None) -> Event:
        async def attempt() -> Event:
            state = await self.reader.current()
            element = _live(state, eid)
            check(element, state)
            act = activity or f"{activity_class.replace('_', '-')}-{uuid7()}"
            body = StageChange(record=element.record, reason=reason, activity=act)
            drafts = [EventDraft(kind, identity_key(element.identity),
                                 msgspec.to_builtins(body), origin=self.origin),
                      self._activity(act, activity_class, (eid,),
                                     {"kind": kind, "reason": reason, "was": element.stage})]
            expect = _expect(state, element.identity)
            if activity is not None:  # a named operation happens once: its key must be new
                expect[activity_key(activity)] = 0
            result = await self.store.append(drafts, expect=expect)
            return result.events[0]

        return await retry_once(attempt)


def _expect(state: ElementsState, *identities: str) -> dict[str, int]:
    return {identity_key(i): state.versions.get(i, 0) for i in identities}


def _live(state: ElementsState, eid: str) -> Element:
    element = state.elements.get(eid)
    if element is None:
        gone = "was purged" if eid in state.purged else "was forgotten or quarantined" \
            if eid in state.forgotten else "does not exist"
        raise InvalidTransition(f"no element {eid!r}: it {gone} (ids are "
                                "'<identity>/<record>')")
    return element


def _purgeable(element: Element, state: ElementsState, *, payload: bool) -> None:
    what = "the payload of" if payload else ""
    if element.legal_hold:
        raise PurgeRefused(f"cannot purge {what} {element.id!r}: it is under legal hold — "
                           "a human releases the hold first")
    if payload:
        if element.digest is None:
            raise InvalidTransition(f"{element.id!r} has no attachment to purge")
        if element.payload_purged:
            raise InvalidTransition(f"the payload of {element.id!r} is already purged")
        return
    if element.stage not in ("archived", "tombstoned"):
        raise PurgeRefused(f"cannot purge {element.id!r}: it is {element.stage} — archive "
                           "(and tombstone) it first; purge is the last rung")
    refs = [r for r in (*element.referenced_by, *element.consolidated_to)
            if r in state.elements]
    if refs:
        raise PurgeRefused(f"cannot purge {element.id!r}: still referenced by "
                           f"{', '.join(sorted(set(refs))[:5])} (derived from, corrects or "
                           "cites it) — routine maintenance never purges referenced evidence")
