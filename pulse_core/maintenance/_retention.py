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

import asyncio
from collections.abc import Callable, Sequence

import msgspec

from pulse_core._clock import Clock, SystemClock
from pulse_core._errors import InvalidTransition, NotAuthorized, PurgeRefused
from pulse_core._events import Event, EventDraft, uuid7
from pulse_core.maintenance._activities import (
    ActivityBody,
    activity_draft,
    activity_key,
    retry_once,
)
from pulse_core.maintenance._authority import HUMAN, Authority, authority_key, rank
from pulse_core.maintenance._element_kinds import (
    Correction,
    StageChange,
    Stale,
    element_id,
    key_destroyed_key,
    split_element_id,
)
from pulse_core.maintenance._element_queries import byte_namers, dependents
from pulse_core.maintenance._element_state import Element, ElementsState, live_references
from pulse_core.maintenance._elements import ElementsReader
from pulse_core.memory import identity_key
from pulse_core.store import EventStore, ObjectStore

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
    (read afresh at every action) and written with origin `origin` and cause `cause`."""

    def __init__(self, store: EventStore, reader: ElementsReader, authority: Authority,
                 principal: str, *, origin: str, objects: ObjectStore | None = None,
                 clock: Clock | None = None, cause: int | None = None) -> None:
        self.store = store
        self.reader = reader
        self.authority = authority
        self.principal = principal
        self.origin = origin
        self.cause = cause
        self.objects = objects if objects is not None else store.objects
        self.clock = clock or SystemClock()

    # -- the ladder ------------------------------------------------------------------------

    async def archive(self, eid: str, reason: str = "") -> Event:
        """active -> archived: out of decay and ordinary recall, still readable and true."""
        return await self._step(eid, "element-archived", "archive", reason,
                                _stage("active", action="archive"),
                                grant=("archive", f"archive {eid!r}"))

    async def restore(self, eid: str, reason: str = "") -> Event:
        """archived -> active."""
        return await self._step(eid, "element-restored", "archive", reason,
                                _stage("archived", action="restore"),
                                grant=("archive", f"restore {eid!r}"))

    async def tombstone(self, eid: str, reason: str = "") -> Event:
        """archived -> tombstoned: logically deleted, the record and its id kept for audit."""
        return await self._step(eid, "element-tombstoned", "tombstone", reason,
                                _stage("archived", action="tombstone"),
                                grant=("retention", f"tombstone {eid!r}"))

    async def set_hold(self, eid: str, reason: str = "") -> Event:
        """Put `eid` under legal hold: never purged (element or payload), never decayed."""
        def check(element: Element, state: ElementsState) -> None:
            if element.legal_hold:
                raise InvalidTransition(f"{eid!r} is already under legal hold")
        return await self._step(eid, "legal-hold-set", "legal_hold", reason, check,
                                grant=("retention", f"hold {eid!r}"))

    async def release_hold(self, eid: str, reason: str = "") -> Event:
        """Release a legal hold: needs the `retention` grant and a human origin (a hold is
        placed for reasons outside the machine; a background writer never lifts one)."""
        if rank(self.origin) != HUMAN:
            raise NotAuthorized(self.principal, "retention", (
                f"{self.origin!r} may not release the legal hold on {eid!r}: only a human "
                "origin ('human:<who>') releases a hold"))

        def check(element: Element, state: ElementsState) -> None:
            if not element.legal_hold:
                raise InvalidTransition(f"{eid!r} is not under legal hold")
        return await self._step(eid, "legal-hold-released", "legal_hold", reason, check,
                                grant=("retention", f"release the hold on {eid!r}"))

    async def purge(self, eid: str, *, confirm: str, reason: str = "") -> Event:
        """Remove an archived or tombstoned element for good (`element-purged`): the Memory
        projection drops the record like a forgotten one and it is never evidence again.

        Its attachment bytes go too, unless anything else names the digest (another live
        element, or any other event of the log: see `byte_namers`): then they stay. The
        decision to delete them is a `payload-purged` event in the same append as the
        `element-purged`, and the bytes are deleted after it; a crash in between leaves
        the decision in the log, and `finish_purges` completes it.

        Its key is destroyed after the append (with a home's store: `store.keys`), so its
        sealed text is unreadable in the log, the checkpoints and every backup, and an
        `element-key-destroyed` event (no key material) records it; `finish_purges`
        completes a purge that stopped before.

        Refused (PurgeRefused, nothing written) when `confirm` is not `eid`, when the element
        is active, under legal hold, or needed by a live element (derived from it, cites it,
        was corrected by it)."""
        digest: list[str] = []

        def check(element: Element, state: ElementsState) -> None:
            if confirm != eid:
                raise PurgeRefused(f"purge of {eid!r} not confirmed: pass confirm={eid!r} "
                                   f"(got {confirm!r})")
            _purgeable(element, state, payload=False)
            digest.clear()
            if element.digest is not None and not byte_namers(state, element.digest,
                                                              besides=eid):
                digest.append(element.digest)

        def extra(element: Element) -> list[EventDraft]:
            return [EventDraft("payload-purged", d, {"reason": reason or "purge",
                                                     "element": eid},
                               origin=self.origin, cause=self.cause)
                    for d in digest]
        event = await self._step(eid, "element-purged", "purge", reason, check,
                                 grant=("purge", f"purge {eid!r}"), activity=f"purge:{eid}",
                                 extra=extra)
        for d in digest:
            await self._delete_bytes(d)
        await self._destroy_keys([eid])
        return event

    async def purge_payload(self, eid: str, *, confirm: str, reason: str = "") -> Event:
        """Delete the bytes of `eid`'s attachment; the event, its digest and the element stay
        (payload_purged set). Needs the purge grant, the confirmation, no legal hold, and
        bytes that nothing else names: the store is content-addressed, so another record
        with the same attachment (held or not) or any other event carrying that digest
        shares them, and the payload purge is refused (PurgeRefused) while it does."""
        if self.objects is None:
            raise InvalidTransition("no object store: open the store with objects= or pass "
                                    "objects= to the RetentionLadder")
        objects = self.objects
        await self.store.require_person("payload-purged", eid,
                                        f"confirm the payload purge of {eid!r}")
        digests: list[str] = []

        def check(element: Element, state: ElementsState) -> None:
            if confirm != eid:
                raise PurgeRefused(f"payload purge of {eid!r} not confirmed: pass "
                                   f"confirm={eid!r} (got {confirm!r})")
            _purgeable(element, state, payload=True)
            assert element.digest is not None
            objects.path_of(element.digest)
            digests[:] = [element.digest]

        def extra(element: Element) -> list[EventDraft]:
            return [EventDraft("payload-purged", d, {"reason": reason or "payload purge",
                                                     "element": eid},
                               origin=self.origin, cause=self.cause)
                    for d in digests]
        event = await self._step(eid, "payload-purged", "payload_purge", reason, check,
                                 grant=("purge", f"purge the payload of {eid!r}"),
                                 extra=extra, own=False)
        await self._delete_bytes(digests[0])
        return event

    async def finish_purges(self) -> list[str]:
        """Delete the bytes of every payload purge the log decided whose bytes are still
        there (a crash between the append and the deletion); returns the digests deleted.
        Re-doable: it re-checks that nothing live still needs the bytes. The keys of purged
        elements still in keys.db are destroyed too (and recorded)."""
        state = await self.reader.current()
        await self._destroy_keys(sorted(state.purged))
        if self.objects is None:
            return []
        done: list[str] = []
        for digest in sorted(state.payloads_purged):
            if self.objects.exists(digest) and digest not in state.foreign and all(
                    state.elements[e].payload_purged and not state.elements[e].legal_hold
                    for e in state.digests.get(digest, ()) if e in state.elements):
                await self._delete_bytes(digest)
                done.append(digest)
        return done

    async def _destroy_keys(self, eids: Sequence[str]) -> None:
        """Destroy the keys of purged `eids` and record each (`element-key-destroyed`, once
        per element: an idempotent append), unless the store keeps no keys."""
        keys = self.store.keys
        if keys is None or not eids:
            return
        fresh = [e for e in eids if not await asyncio.to_thread(keys.destroyed, e)]
        for eid in fresh:
            await asyncio.to_thread(keys.destroy, eid)
        if fresh:
            await self.store.append([EventDraft(
                "element-key-destroyed", key_destroyed_key(eid), {"element": eid},
                origin=self.origin, cause=self.cause, idem=f"element-key-destroyed:{eid}")
                for eid in fresh])

    async def _delete_bytes(self, digest: str) -> None:
        if self.objects is not None:
            await asyncio.to_thread(self.objects.delete_sync, digest)

    # -- correction and derivation review ----------------------------------------------------

    async def correct(self, identity: str, old_record: str, new_record: str,
                      reason: str = "", *, depth: int = 2, limit: int = 100) -> list[str]:
        """Record that `new_record` corrects `old_record` (`evidence-corrected`): both stay,
        linked both ways; what derives from the old one is flagged stale in the same append.
        Returns the ids flagged stale. Needs the `maintain` grant."""
        old, new = element_id(identity, old_record), element_id(identity, new_record)
        async def attempt() -> list[str]:
            guard = await self._allowed("maintain", f"correct {old!r}")
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
                                 msgspec.to_builtins(body), origin=self.origin,
                                 cause=self.cause)]
            flagged, stale = self._stale_drafts(state, old, depth, limit, "evidence corrected")
            identities = {identity} | {split_element_id(e)[0] for e in flagged}
            drafts += [*stale, self._activity(f"correction-{uuid7()}", "evidence_correction",
                                              (old, new), {"reason": reason,
                                                           "stale": flagged})]
            await self.store.append(drafts, expect=_expect(state, *identities) | guard)
            return flagged

        return await retry_once(attempt)

    async def mark_stale(self, root: str, *, depth: int = 2, limit: int = 100,
                         reason: str = "root revised") -> list[str]:
        """Flag the dependents of `root` (depth- and count-bounded) with `derivation-stale`;
        returns the ids newly flagged ([] and nothing written when there are none). Stale
        is a review flag only. Needs the `maintain` grant."""
        async def attempt() -> list[str]:
            guard = await self._allowed("maintain", f"review {root!r}")
            state = await self.reader.current()
            flagged, drafts = self._stale_drafts(state, root, depth, limit, reason)
            if not flagged:
                return []
            identities = {split_element_id(e)[0] for e in flagged}
            drafts.append(self._activity(f"derivation-review-{uuid7()}", "derivation_review",
                                         (root,), {"stale": flagged, "reason": reason}))
            await self.store.append(drafts, expect=_expect(state, *identities) | guard)
            return flagged

        return await retry_once(attempt)

    async def clear_stale(self, eid: str, reason: str = "reviewed") -> Event:
        """Clear `eid`'s stale flag after its review (`derivation-reviewed`); a later
        revision of a root flags it again. Needs the `maintain` grant."""
        def check(element: Element, state: ElementsState) -> None:
            if not element.stale:
                raise InvalidTransition(f"{eid!r} is not flagged stale")
        return await self._step(eid, "derivation-reviewed", "derivation_review", reason, check,
                                grant=("maintain", f"clear the stale flag of {eid!r}"))

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
                                     msgspec.to_builtins(body), origin=self.origin,
                                     cause=self.cause))
        return flagged, drafts

    def _activity(self, activity_id: str, activity_class: str, inputs: Sequence[str],
                  report: object) -> EventDraft:
        now = self.clock.now_ms()
        body = ActivityBody(activity_class=activity_class, actors=(self.principal,),
                            inputs=tuple(inputs), outputs=tuple(inputs), started_at=now,
                            ended_at=now, report=report)
        return activity_draft(activity_id, body, origin=self.origin, cause=self.cause)

    async def _allowed(self, permission: str, action: str) -> dict[str, int]:
        """Check the grant now; the expectation that makes a write conflict if it is revoked
        before the write commits (the retry re-checks, and refuses)."""
        version = await self.authority.check(self.principal, permission, action)
        return {authority_key(self.principal): version}

    async def _step(self, eid: str, kind: str, activity_class: str, reason: str,
                    check: Check, *, grant: tuple[str, str], activity: str | None = None,
                    extra: Callable[[Element], list[EventDraft]] | None = None,
                    own: bool = True) -> Event:
        """One guarded action on `eid`: grant checked, state read, `check`ed, then one
        append of the `kind` event (unless not `own`), the `extra` drafts and the activity,
        expecting the identity's and the grants' versions; retried once on a conflict."""
        async def attempt() -> Event:
            guard = await self._allowed(*grant)
            state = await self.reader.current()
            element = _live(state, eid)
            check(element, state)
            act = activity or f"{activity_class.replace('_', '-')}-{uuid7()}"
            body = StageChange(record=element.record, reason=reason, activity=act,
                               channel=self.store.principal.channel)
            drafts = [EventDraft(kind, identity_key(element.identity),
                                 msgspec.to_builtins(body), origin=self.origin,
                                 cause=self.cause)] if own else []
            drafts += [*(extra(element) if extra is not None else ()),
                       self._activity(act, activity_class, (eid,),
                                      {"kind": kind, "reason": reason, "was": element.stage,
                                       "digest": element.digest})]
            expect = _expect(state, element.identity) | guard
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
    what = "the payload of " if payload else ""
    if element.legal_hold:
        raise PurgeRefused(f"cannot purge {what}{element.id!r}: it is under legal hold — "
                           "a human releases the hold first")
    if payload:
        if element.digest is None:
            raise InvalidTransition(f"{element.id!r} has no attachment to purge")
        if element.payload_purged:
            raise InvalidTransition(f"the payload of {element.id!r} is already purged")
        others = byte_namers(state, element.digest, besides=element.id)
        if others:
            held = [e for e in others if getattr(state.elements.get(e), "legal_hold", False)]
            raise PurgeRefused(
                f"cannot purge the payload of {element.id!r}: its bytes are shared with "
                f"{', '.join(others[:5])}" + (f" (under legal hold: {', '.join(held[:5])})"
                                              if held else "")
                + " — the store keeps one copy per content; purge those first")
        return
    if element.stage not in ("archived", "tombstoned"):
        raise PurgeRefused(f"cannot purge {element.id!r}: it is {element.stage} — archive "
                           "(and tombstone) it first; purge is the last rung")
    refs = live_references(state.elements, element)
    if refs:
        raise PurgeRefused(f"cannot purge {element.id!r}: still referenced by "
                           f"{', '.join(refs[:5])} (derived from it, cites it or was "
                           "corrected by it) — routine maintenance never purges referenced "
                           "evidence")
