"""Assessment: the read-only counts a cycle starts from (seed 004, section 6: count first, act
second). It reads folded states only: no access counter, no strength, nothing is written."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import msgspec

from pulse_adapters.maintenance._skill_health import SkillHealth
from pulse_core.maintenance import (
    Element,
    ElementsState,
    IdentityBeliefs,
    SleepTask,
    Watch,
    contested,
    imported,
    sleep_task_counts,
)

DAY_MS = 86_400_000
UNCONSOLIDATED_AGE_MS = 7 * DAY_MS


class Assessment(msgspec.Struct, frozen=True, kw_only=True):
    """Counts over memory as it stands. `retention_backlog` counts archive candidates under
    the settings (consolidated exchanges at the decay floor, past `archive_after_days`);
    `stale_unreviewed` the stale items with no open review task; `average_strength` is
    observed, never optimized (strength is accessibility, not truth). `skills_awaiting_verdict`
    counts skills the deterministic verdict would move now, `trials_starved` trials whose
    family is observed but never under the skill (see _skill_health); `imports_flagged` the
    live imported elements flagged for review that no person has verified yet."""

    elements: int = 0
    active: int = 0
    archived: int = 0
    tombstoned: int = 0
    pending_sleep_tasks: int = 0
    failed_sleep_tasks: int = 0
    unconsolidated: int = 0
    unconsolidated_old: int = 0
    overdue_commitments: int = 0
    open_commitments: int = 0
    watches_armed: int = 0
    watches_past_due: int = 0
    stale_derived: int = 0
    stale_unreviewed: int = 0
    retention_backlog: int = 0
    contested_slots: int = 0
    skills_awaiting_verdict: int = 0
    trials_starved: int = 0
    imports_flagged: int = 0
    average_strength: float = 0.0


def overdue(e: Element, now: int) -> bool:
    """A pending or blocked commitment whose due time has passed."""
    c = e.commitment
    return (c is not None and c.status in ("pending", "blocked") and c.due_at is not None
            and c.due_at < now)


def archive_candidate(e: Element, now: int, archive_after_days: float, floor: float) -> bool:
    """An active exchange, consolidated into something, at the decay floor, and older than
    `archive_after_days` (0: never): what retention review may archive."""
    return (archive_after_days > 0 and e.type == "exchange" and e.stage == "active"
            and bool(e.consolidated_to) and e.strength <= floor and not e.legal_hold
            and e.created_at < now - int(archive_after_days * DAY_MS))


def contested_slots(beliefs: Mapping[str, IdentityBeliefs],
                    corrected: Collection[str] = ()) -> list[str]:
    """The contested belief slots as "<identity>/<slot>", sorted."""
    return [f"{identity}/{slot}" for identity, slot in contested(beliefs, corrected)]


@dataclass(frozen=True)
class Census:
    """One pass over the elements at time `now`: the counts assessment reports and the
    elements the review steps act on (so a cycle reads its elements once per change)."""

    counts: dict[str, int]
    strength: float
    overdue: tuple[Element, ...]
    candidates: tuple[Element, ...]
    revised: tuple[Element, ...]
    stale: tuple[str, ...]
    corrected: frozenset[str]
    imported: tuple[Element, ...] = ()
    commitments: tuple[Element, ...] = ()


def census(elements: ElementsState, *, now: int, archive_after_days: float,
           floor: float, import_origins: Iterable[str] = ()) -> Census:
    """The census of `elements` at `now` (see Census). `revised` holds the elements revised
    at some point that others cite (roots of derived items), oldest revision first;
    `imported` the live (active or archived) elements a writer under one of
    `import_origins` wrote, oldest first; `commitments` the open (pending or blocked)
    commitments, in no particular order."""
    origins = tuple(import_origins)
    writers: dict[str, bool] = {}  # few writers, many elements: each judged once
    outside: list[Element] = []
    stages: dict[str, int] = dict.fromkeys(("active", "archived", "tombstoned"), 0)
    unconsolidated = unconsolidated_old = 0
    commitments: list[Element] = []
    strength = 0.0
    old = now - UNCONSOLIDATED_AGE_MS
    late: list[Element] = []
    candidates: list[Element] = []
    revised: list[Element] = []
    stale: list[str] = []
    corrected: set[str] = set()
    for e in elements.elements.values():
        stages[e.stage] = stages.get(e.stage, 0) + 1
        strength += e.strength
        if e.type == "exchange":
            if e.stage == "active" and not e.consolidated_to:
                unconsolidated += 1
                unconsolidated_old += e.created_at < old
            elif archive_candidate(e, now, archive_after_days, floor):
                candidates.append(e)
        if e.commitment is not None and e.commitment.status in ("pending", "blocked"):
            commitments.append(e)
            if overdue(e, now):
                late.append(e)
        if e.stale:
            stale.append(e.id)
        if e.corrected_by is not None:
            corrected.add(e.id)
        if e.revised_seq is not None and e.referenced_by:
            revised.append(e)
        if origins:
            by = writers.get(e.writer)
            if by is None:
                by = writers[e.writer] = imported(e.writer, origins)
            if by and e.stage in ("active", "archived"):
                outside.append(e)
    late.sort(key=lambda e: (e.commitment.due_at if e.commitment else 0) or 0)
    candidates.sort(key=lambda e: e.created_seq)
    revised.sort(key=lambda e: e.revised_seq or 0)
    outside.sort(key=lambda e: (e.created_at, e.id))
    counts = {"elements": len(elements.elements), **stages, "unconsolidated": unconsolidated,
              "unconsolidated_old": unconsolidated_old, "open_commitments": len(commitments)}
    return Census(counts, strength, tuple(late), tuple(candidates), tuple(revised),
                  tuple(stale), frozenset(corrected), tuple(outside),
                  tuple(commitments))


def assess(found: Census, *, now: int, beliefs: Mapping[str, IdentityBeliefs] | None = None,
           sleep: Mapping[str, SleepTask] | None = None,
           watches: Mapping[str, Watch] | None = None,
           reviewing: Collection[str] = (), kept: Collection[str] = (),
           skills: SkillHealth | None = None) -> Assessment:
    """The assessment counts from a census (and `beliefs`, the sleep-task and watch states
    when given) at `now`. `reviewing` holds element ids with an open review task, `kept`
    those somebody restored from the archive (reviewed: not retention backlog); `skills` the
    skill rows (skill_health)."""
    counts = found.counts
    total = counts["elements"]
    tasks = sleep_task_counts(sleep.values()) if sleep is not None else {}
    armed = [w for w in (watches or {}).values() if w.status == "armed"]
    return Assessment(
        elements=total, active=counts.get("active", 0), archived=counts.get("archived", 0),
        tombstoned=counts.get("tombstoned", 0), pending_sleep_tasks=tasks.get("pending", 0),
        failed_sleep_tasks=tasks.get("failed", 0), unconsolidated=counts["unconsolidated"],
        unconsolidated_old=counts["unconsolidated_old"],
        overdue_commitments=len(found.overdue), open_commitments=counts["open_commitments"],
        watches_armed=len(armed),
        watches_past_due=sum(1 for w in armed if w.spec.due_at is not None
                             and w.spec.due_at <= now),
        stale_derived=len(found.stale),
        stale_unreviewed=sum(1 for eid in found.stale if eid not in reviewing),
        retention_backlog=sum(1 for e in found.candidates if e.id not in kept),
        contested_slots=len(contested_slots(beliefs, found.corrected)) if beliefs else 0,
        skills_awaiting_verdict=len(skills.awaiting) if skills else 0,
        trials_starved=len(skills.starved) if skills else 0,
        average_strength=round(found.strength / total, 4) if total else 0.0)
