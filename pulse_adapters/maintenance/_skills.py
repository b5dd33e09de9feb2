"""Skills and their lifecycle verdicts (seed 004, sections 11 and 12).

A skill (`skill:<id>`) is a compiled procedure for one task family: the stream of outcomes
that can prove it wrong. It moves proposed -> trialed -> adopted -> revoked only through a
recorded `skill-verdict`, and a verdict counts only when `verdict()`, run again over the
log as it stood (the outcomes up to the verdict's `through_seq`, the policy it names),
gives the same answer: a status written any other way is ignored by the fold.

Outcomes (`outcome-observed`, on `task-family:<family>`) are graded, never trusted: an
outcome is treatment evidence for a skill only when its decision is an `action_gate`
activity recorded before it that named the skill, and only when someone other than the
actor observed it. A skill's utility is an admission bet, never a permission.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fractions import Fraction

import msgspec

from pulse_core import Event, EventDraft, InvalidEvent, InvalidTransition, register_kind, uuid7
from pulse_core.maintenance import Activity, ActivityBody, activity_draft, read_activity, retry_once
from pulse_core.store import EventStore

STATUSES = ("proposed", "trialed", "adopted", "revoked")
SEVERITIES = ("low", "normal", "high")
TRANSITIONS = frozenset({("proposed", "trialed"), ("revoked", "trialed"), ("trialed", "adopted"),
                         ("trialed", "revoked"), ("adopted", "trialed"), ("adopted", "revoked")})
"""Every move a verdict may make; re-entry after revocation is a new trial."""
TEXT_CHARS = 4_000
"""The longest name, summary or procedure a skill may carry."""


def skill_key(skill_id: str) -> str:
    """The event key of skill `skill_id`."""
    return f"skill:{skill_id}"


def family_key(task_family: str) -> str:
    """The event key of a task family's outcome stream."""
    return f"task-family:{task_family}"


def _name(value: str, what: str) -> None:
    if not value or value != value.strip() or any(c.isspace() for c in value):
        raise ValueError(f"{what} {value!r} must be a non-empty name without spaces")


class SkillProposed(msgspec.Struct, frozen=True, kw_only=True):
    """skill-proposed: a compiled skill and its admission bet (`utility`, 0..1)."""

    name: str
    task_family: str
    summary: str = ""
    procedure: str = ""
    compiled_from: tuple[str, ...] = ()
    utility: float = 0.5

    def __post_init__(self) -> None:
        if not self.task_family.strip():
            raise ValueError("a skill needs a task_family: the outcome stream that can prove "
                             "it wrong — without one, store the pattern as an insight")
        _name(self.task_family, "task_family")
        if not self.name.strip():
            raise ValueError("a skill needs a name")
        if max(len(self.name), len(self.summary), len(self.procedure)) > TEXT_CHARS:
            raise ValueError(f"name, summary and procedure are at most {TEXT_CHARS} characters")
        if not 0.0 <= self.utility <= 1.0:
            raise ValueError(f"utility {self.utility} is outside 0..1")


class OutcomeObserved(msgspec.Struct, frozen=True, kw_only=True):
    """outcome-observed: how one attempt in `task_family` went, as `observer` saw it.

    `decision` is the action_gate activity that applied the skills in `applied` ("" for a
    baseline outcome); `actor` is whose action it was."""

    task_family: str
    success: bool
    actor: str
    observer: str
    severity: str = "normal"
    decision: str = ""
    applied: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _name(self.task_family, "task_family")
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")
        if self.applied and not self.decision:
            raise ValueError("applied skills need the decision (an action_gate activity id) "
                             "that applied them")


class Tally(msgspec.Struct, frozen=True):
    """Graded outcomes counted: how many, and how many succeeded."""

    n: int = 0
    successes: int = 0

    def rate(self, prior: float) -> Fraction:
        """The success rate, exactly; `prior` when there is nothing to count."""
        return Fraction(self.successes, self.n) if self.n else Fraction(prior)


class VerdictPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The deterministic rule's parameters.

    Adopt when at least `quota` treatment outcomes beat the baseline's rate by `margin`;
    revoke when one high-severity failure happens under the skill, or when at least
    `revoke_quota` (never more than `quota`) treatment outcomes fall below the baseline;
    demote an adopted skill to trial when it no longer beats the baseline by `margin`.
    `prior` stands in for an empty baseline's rate."""

    quota: int = 5
    margin: float = 0.1
    revoke_quota: int = 3
    prior: float = 0.5

    def __post_init__(self) -> None:
        if self.quota < 1:
            raise ValueError(f"quota {self.quota} must be at least 1")
        if not 1 <= self.revoke_quota <= self.quota:
            raise ValueError(f"revoke_quota {self.revoke_quota} must be 1..quota ({self.quota}):"
                             " revoking is never harder than adopting")
        if not 0.0 <= self.margin <= 1.0 or not 0.0 <= self.prior <= 1.0:
            raise ValueError(f"margin {self.margin} and prior {self.prior} must be within 0..1")


class SkillVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """skill-verdict: the lifecycle moved `from_status` -> `to_status` by `rule`, over the
    outcomes up to `through_seq` graded under `policy`."""

    from_status: str
    to_status: str
    rule: str
    treatment: Tally
    baseline: Tally
    reason: str
    through_seq: int
    policy: VerdictPolicy


register_kind("skill-proposed", "a skill compiled for a task family (utility: an admission "
              "bet, never authority); key: skill:<id>", SkillProposed)
register_kind("outcome-observed", "an outcome in a task family, observed by someone; key: "
              "task-family:<family>", OutcomeObserved)
register_kind("skill-verdict", "a skill's lifecycle moved by the deterministic verdict; key: "
              "skill:<id>", SkillVerdict)


class Skill(msgspec.Struct, frozen=True):
    """A skill's current form. `baseline` and `trial_seq` are frozen when a trial opens:
    treatment outcomes are those after `trial_seq`."""

    id: str
    body: SkillProposed
    status: str
    version: int
    baseline: Tally = Tally()
    trial_seq: int = 0
    reproposed: bool = False
    verdicts: int = 0


class GradedOutcome(msgspec.Struct, frozen=True, gc=False):
    """An outcome as evidence: `applied` holds only the skills its decision provably named,
    `independent` whether someone other than the actor observed it."""

    seq: int
    task_family: str
    success: bool
    severity: str
    decision: str
    applied: frozenset[str]
    independent: bool


def same_actor(actor: str, observer: str) -> bool:
    """Whether `observer` is `actor` (or a narrower or wider name of it: `agent` and
    `agent:turn-3` are one actor)."""
    a, o = actor.partition(":"), observer.partition(":")
    return actor == observer or (a[0] == o[0] and (not a[2] or not o[2]))


def grade(event: Event, decision_actors: Sequence[str] | None,
          decision_skills: Iterable[str]) -> GradedOutcome:
    """Grade one outcome-observed event, given its decision's actors and the skill keys its
    inputs named (None: the decision is not a completed action_gate recorded before it)."""
    body = event.payload(OutcomeObserved)
    named = {s.removeprefix("skill:") for s in decision_skills}
    applied = frozenset(body.applied) & named if decision_actors is not None else frozenset()
    actors = (body.actor, *(decision_actors or ()))
    independent = (body.observer == event.origin
                   and not any(same_actor(a, body.observer) for a in actors))
    return GradedOutcome(event.seq, body.task_family, body.success, body.severity,
                         body.decision, applied, independent)


def _split(skill: Skill, outcomes: Sequence[GradedOutcome], through: int
           ) -> tuple[list[GradedOutcome], Tally]:
    """The skill's treatment outcomes since its trial opened (one per decision), and the
    baseline its family showed up to `through` (for a trial that opens now)."""
    treatment: list[GradedOutcome] = []
    decisions: set[str] = set()
    base_n = base_s = 0
    for o in outcomes:
        if o.task_family != skill.body.task_family or not o.independent or o.seq > through:
            continue
        if skill.id in o.applied:
            if o.seq > skill.trial_seq and o.decision not in decisions:
                decisions.add(o.decision)
                treatment.append(o)
        else:
            base_n, base_s = base_n + 1, base_s + o.success
    return treatment, Tally(base_n, base_s)


def verdict(skill: Skill, outcomes: Sequence[GradedOutcome], policy: VerdictPolicy
            ) -> SkillVerdict | None:
    """The verdict the rule gives `skill` over graded `outcomes`, or None (no move).

    Pure and deterministic: the same skill, outcomes and policy always give the same
    answer, so anyone can check a recorded verdict by running it again."""
    through = max((o.seq for o in outcomes), default=skill.trial_seq)
    treated, fresh = _split(skill, outcomes, through)
    tally = Tally(len(treated), sum(o.success for o in treated))
    status = skill.status

    def move(to: str, rule: str, reason: str, baseline: Tally | None = None) -> SkillVerdict:
        return SkillVerdict(from_status=status, to_status=to, rule=rule,
                            treatment=tally if baseline is None else Tally(),
                            baseline=skill.baseline if baseline is None else baseline,
                            reason=reason, through_seq=through, policy=policy)

    if status == "proposed" or (status == "revoked" and skill.reproposed):
        rule = "trial-opened" if status == "proposed" else "trial-reopened"
        return move("trialed", rule, f"baseline frozen: {fresh.successes}/{fresh.n} of "
                    f"{skill.body.task_family} succeeded", baseline=fresh)
    if status not in ("trialed", "adopted"):
        return None
    if any(o.severity == "high" and not o.success for o in treated):
        return move("revoked", "high-severity-failure",
                    "a high-severity failure under the skill")
    base = skill.baseline.rate(policy.prior)
    rate = tally.rate(policy.prior)
    if tally.n >= policy.revoke_quota and rate < base:
        return move("revoked", "below-baseline", f"{tally.successes}/{tally.n} is below the "
                    f"baseline's {float(base):.3f}")
    beats = tally.n >= policy.quota and rate > base and rate - base >= Fraction(policy.margin)
    if status == "trialed" and beats:
        return move("adopted", "beats-baseline", f"{tally.successes}/{tally.n} beats the "
                    f"baseline's {float(base):.3f} by at least {policy.margin:g}")
    if status == "adopted" and not beats:
        return move("trialed", "degraded", f"{tally.successes}/{tally.n} no longer beats the "
                    f"baseline's {float(base):.3f} by {policy.margin:g}: back on trial")
    return None


def fold_skill(events: Iterable[Event], outcomes: Sequence[GradedOutcome]) -> Skill | None:
    """The skill after its events. A verdict moves it only when it is a legal transition
    and `verdict()` over `outcomes` up to its `through_seq` gives exactly it again; every
    other event, or a verdict that does not check out, changes nothing."""
    skill: Skill | None = None
    for event in events:
        if event.kind == "skill-proposed":
            body = event.payload(SkillProposed)
            if skill is None:
                skill = Skill(event.key.removeprefix("skill:"), body, "proposed", event.version)
            elif skill.status == "revoked" and body.task_family == skill.body.task_family:
                skill = msgspec.structs.replace(skill, body=body, reproposed=True,
                                                version=event.version)
        elif event.kind == "skill-verdict" and skill is not None:
            recorded = event.payload(SkillVerdict)
            seen = [o for o in outcomes if o.seq <= recorded.through_seq]
            if ((recorded.from_status, recorded.to_status) in TRANSITIONS
                    and recorded.through_seq < event.seq
                    and verdict(skill, seen, recorded.policy) == recorded):
                skill = _moved(skill, recorded)
        if skill is not None:
            skill = msgspec.structs.replace(skill, version=event.version)
    return skill


def _moved(skill: Skill, v: SkillVerdict) -> Skill:
    opens = v.to_status == "trialed" and v.from_status in ("proposed", "revoked")
    return msgspec.structs.replace(
        skill, status=v.to_status, verdicts=skill.verdicts + 1,
        baseline=v.baseline if opens else skill.baseline,
        trial_seq=v.through_seq if opens else skill.trial_seq,
        reproposed=False if opens else skill.reproposed)


class SkillBoard:
    """Writes skills, outcomes and verdicts; reads skills as the verified fold gives them."""

    def __init__(self, store: EventStore, origin: str = "executor:maintenance") -> None:
        self.store = store
        self.origin = origin

    async def propose(self, skill_id: str, body: SkillProposed) -> Event:
        """Record a new skill (or a revised artifact of a revoked one, which reopens a trial
        at the next verdict) with its skill_compilation activity, in one append."""
        _name(skill_id, "skill id")
        current = await self.read(skill_id)
        if current is not None and current.status != "revoked":
            raise InvalidTransition(f"skill {skill_id!r} is {current.status}: only a new or a "
                                    "revoked skill is proposed — its verdicts move it on")
        if current is not None and current.body.task_family != body.task_family:
            raise InvalidTransition(f"skill {skill_id!r} is graded by {current.body.task_family!r}"
                                    ": a revision keeps its task_family — propose a new skill")
        version = await self.store.head(skill_key(skill_id))
        compile_ = activity_draft(f"skill_compilation:{skill_id}:{version}", ActivityBody(
            activity_class="skill_compilation", actors=(self.origin,),
            inputs=body.compiled_from, outputs=(skill_key(skill_id),)), origin=self.origin)
        draft = EventDraft("skill-proposed", skill_key(skill_id), msgspec.to_builtins(body),
                           origin=self.origin)
        result = await self.store.append([draft, compile_], expect={
            skill_key(skill_id): version, compile_.key: 0})
        return result.events[0]

    async def observe(self, body: OutcomeObserved, *, idem: str | None = None) -> Event:
        """Record an outcome as `body.observer` (the event's origin) with its
        outcome_observation activity linking it to its decision, in one append; `idem` makes
        a retried report of the same outcome write nothing new."""
        record = f"oc-{idem or uuid7()}"
        link = activity_draft(f"outcome_observation:{record}", ActivityBody(
            activity_class="outcome_observation", actors=(body.observer,),
            inputs=(body.decision,) if body.decision else (),
            outputs=(f"{family_key(body.task_family)}/{record}",)), origin=body.observer)
        draft = EventDraft("outcome-observed", family_key(body.task_family),
                           msgspec.to_builtins(body), origin=body.observer, idem=idem)
        if idem is not None:
            link = msgspec.structs.replace(link, idem=f"{idem}/link")
        return (await self.store.append([draft, link])).events[0]

    async def outcomes(self, task_family: str) -> list[GradedOutcome]:
        """The family's outcomes, graded against the decisions they name."""
        graded: list[GradedOutcome] = []
        decisions: dict[str, Activity | None] = {}
        for event in await self.store.read(key=family_key(task_family),
                                           kinds=["outcome-observed"]):
            name = event.payload(OutcomeObserved).decision
            if name and name not in decisions:
                decisions[name] = await read_activity(self.store, name)
            act = decisions.get(name)
            if (act is None or act.activity_class != "action_gate"
                    or act.status != "completed" or act.seq >= event.seq):
                graded.append(grade(event, None, ()))  # no decision applied anything
            else:
                graded.append(grade(event, act.actors, act.inputs))
        return graded

    async def _load(self, skill_id: str) -> tuple[Skill, list[GradedOutcome]] | None:
        events = await self.store.read(key=skill_key(skill_id))
        first = next((e for e in events if e.kind == "skill-proposed"), None)
        if first is None:
            return None
        outcomes = await self.outcomes(first.payload(SkillProposed).task_family)
        skill = fold_skill(events, outcomes)
        return None if skill is None else (skill, outcomes)

    async def read(self, skill_id: str) -> Skill | None:
        """Skill `skill_id` as its verified verdicts left it, or None."""
        loaded = await self._load(skill_id)
        return None if loaded is None else loaded[0]

    async def decide(self, skill_id: str, policy: VerdictPolicy | None = None, *,
                     cause: int | None = None) -> SkillVerdict | None:
        """Run the verdict and, when it moves the skill, record it (with cause `cause`) with
        a lifecycle_verdict activity in one append guarded by the skill's expected version (a
        conflict: re-read, re-evaluate, retry once). None: the rule says nothing changes."""
        rule = policy or VerdictPolicy()

        async def attempt() -> SkillVerdict | None:
            loaded = await self._load(skill_id)
            if loaded is None:
                raise InvalidEvent(f"no skill {skill_id!r}: propose it first")
            skill, outcomes = loaded
            found = verdict(skill, outcomes, rule)
            if found is None:
                return None
            key = skill_key(skill_id)
            record = activity_draft(f"lifecycle_verdict:{skill_id}:{skill.version}",
                                    ActivityBody(
                activity_class="lifecycle_verdict", actors=(self.origin,),
                inputs=(key, family_key(skill.body.task_family)), outputs=(key,),
                report=msgspec.to_builtins(found)), origin=self.origin, cause=cause)
            draft = EventDraft("skill-verdict", key, msgspec.to_builtins(found),
                               origin=self.origin, cause=cause)
            await self.store.append([draft, record],
                                    expect={key: skill.version, record.key: 0})
            return found

        return await retry_once(attempt)
