"""The two skill rows of maintenance's health table (seed 004, section 35): skills a verdict is
due on, and trials starved of linked outcomes, read from the log."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from pulse_adapters.maintenance._skills import (
    GradedOutcome,
    Skill,
    SkillBoard,
    SkillProposed,
    VerdictPolicy,
    fold_skill,
    skill_key,
    verdict,
)
from pulse_core.store import EventStore


class SkillHealth(msgspec.Struct, frozen=True):
    """Skills a verdict is due on but not recorded (`awaiting`), and trials starved of
    linked outcomes (`starved`): ids, sorted."""

    awaiting: tuple[str, ...] = ()
    starved: tuple[str, ...] = ()


def starved(skill: Skill, outcomes: Sequence[GradedOutcome], policy: VerdictPolicy) -> bool:
    """A trial whose family was observed independently at least `policy.quota` times since
    it opened while not one of those outcomes links to the skill: outcomes arrive, but the
    decisions that applied it are not being recorded (or not observed)."""
    if skill.status != "trialed":
        return False
    since = [o for o in outcomes if o.seq > skill.trial_seq and o.independent
             and o.task_family == skill.body.task_family]
    return len(since) >= policy.quota and not any(skill.id in o.applied for o in since)


async def skill_health(store: EventStore, policy: VerdictPolicy | None = None) -> SkillHealth:
    """The two skill rows of the health table over the log as it stands (read-only)."""
    rule = policy or VerdictPolicy()
    board = SkillBoard(store)
    awaiting: list[str] = []
    hungry: list[str] = []
    families: dict[str, list[GradedOutcome]] = {}
    for skill_id in sorted({e.key.removeprefix("skill:")
                            for e in await store.read(kinds=["skill-proposed"])}):
        events = await store.read(key=skill_key(skill_id))
        first = next((e for e in events if e.kind == "skill-proposed"), None)
        if first is None:
            continue
        family = first.payload(SkillProposed).task_family
        if family not in families:
            families[family] = await board.outcomes(family)
        skill = fold_skill(events, families[family])
        if skill is None:
            continue
        if verdict(skill, families[family], rule) is not None:
            awaiting.append(skill_id)
        if starved(skill, families[family], rule):
            hungry.append(skill_id)
    return SkillHealth(tuple(awaiting), tuple(hungry))
