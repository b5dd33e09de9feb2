"""Seed 004's review of imported cognition (cycle step 13): memory that came from outside.

An element is imported when its writer's origin is one of the settings' import origins, or
under one (`agent:import`, `agent:peer:<agent>`, `agent:tool:<name>`, `agent:web:<site>` by
default; pulse_core.maintenance.imported). One still unverified `imports.review_after_days`
after it was written is flagged once (`import-flagged`): kept out of the self-model, counted
in the health table, and left for a person, who verifies it (`verify_import`: the gate) or
quarantines the record. Nothing here lowers a confidence (time passing is not evidence),
quarantines (a person's kind), or raises an import's authority: recall ranks an unverified
import as a background writer's and a verified one as its writer's, never higher (imported
authority does not transfer).
"""

from __future__ import annotations

import msgspec

from pulse_adapters.maintenance._assessment import Census
from pulse_adapters.maintenance._context import CycleRun
from pulse_adapters.maintenance._settings import ORIGIN
from pulse_core import Event, EventDraft, PersistentMap, Projection, register_kind
from pulse_core.maintenance import (
    HUMAN,
    IMPORT_VERIFIED,
    Element,
    rank,
)
from pulse_core.maintenance import import_review_key as review_key

FLAGGED = "import-flagged"
VERIFIED = IMPORT_VERIFIED
DAY_MS = 86_400_000
MAX_FLAGS_PER_APPEND = 200


class ImportFlagged(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of import-flagged: the element, who wrote it, when, how old it was when the
    cycle judged it, and why."""

    element: str
    writer: str
    created_at: int
    age_days: float
    cycle: str
    reason: str = ""


register_kind(FLAGGED, "maintenance flagged imported cognition unverified past its review "
              "age; key: import-review:<element id>", ImportFlagged)


class ImportReviews(Projection[PersistentMap[str, str]]):
    """Element id -> "flagged" or "verified". A flag counts only from maintenance's origin,
    a verification only from a person's (an agent, an importer or the engine cannot verify
    what it imported); once verified an element stays verified."""

    name = "maintenance-import-reviews"
    kinds = frozenset({FLAGGED, VERIFIED})

    def initial(self) -> PersistentMap[str, str]:
        return PersistentMap()

    def apply(self, state: PersistentMap[str, str], event: Event) -> PersistentMap[str, str]:
        element = event.data.get("element") if isinstance(event.data, dict) else None
        if not isinstance(element, str) or event.key != review_key(element):
            return state
        if event.kind == VERIFIED and rank(event.origin) == HUMAN:
            return state.set(element, "verified")
        if event.kind == FLAGGED and event.origin == ORIGIN and element not in state:
            return state.set(element, "flagged")
        return state


def unverified(found: Census, reviews: PersistentMap[str, str]) -> list[Element]:
    """Live imported elements (active or archived) no person has verified, oldest first."""
    return [e for e in found.imported if reviews.get(e.id) != "verified"]


def flagged_count(found: Census, reviews: PersistentMap[str, str]) -> int:
    """Flagged imports still live and unverified: the health table's quarantine backlog."""
    return sum(1 for e in unverified(found, reviews) if e.id in reviews)


async def imported_review(run: CycleRun) -> None:
    """13. Imported cognition review: every live imported element no person verified and
    older than `imports.review_after_days` is flagged once (import-flagged), within the
    cycle's budgets; its confidence, stage and authority are left as they are."""
    settings = run.settings.imports
    if not settings.origins or not await run.allowed("maintain", "review imported cognition"):
        return
    reviews = await run.fold(ImportReviews())
    cutoff = run.cycle_start - int(settings.review_after_days * DAY_MS)
    due = [e for e in unverified(await run.census(), reviews)
           if e.id not in reviews and e.created_at <= cutoff]
    due = due[:run.budget.review(len(due))]
    while due:
        batch = due[:min(MAX_FLAGS_PER_APPEND, run.budget.writes_left)]
        if not batch or not run.budget.allows(writes=len(batch), transactions=1):
            break
        await run.append([_flag(run, e) for e in batch])
        due = due[len(batch):]
    if due:
        run.deferred.append(f"imported review: {len(due)} imported element(s) not flagged "
                            "(budget)")


def _flag(run: CycleRun, e: Element) -> EventDraft:
    age = round((run.cycle_start - e.created_at) / DAY_MS, 2)
    body = ImportFlagged(
        element=e.id, writer=e.writer, created_at=e.created_at, age_days=age, cycle=run.cycle,
        reason=(f"imported by {e.writer} {age} days ago and not verified: kept out of the "
                "self-model, its authority stays its writer's; a person verifies it "
                "(verify_import) or quarantines the record"))
    return EventDraft(FLAGGED, review_key(e.id), msgspec.to_builtins(body), origin=ORIGIN,
                      cause=run.cause, idem=f"maintenance:import-flagged:{run.cycle}:{e.id}")
