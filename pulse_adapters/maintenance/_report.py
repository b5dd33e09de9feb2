"""A cycle's final report and health signals, and the budget every step of a cycle draws on.

The report is the `report` of the cycle's `activity-completed` (seed 004, section 36): counts,
changes, what was deferred, what needed authority maintenance lacks, warnings, and the health
signals of section 35 computed over the memory the cycle leaves behind. "Nothing safe to do
this cycle" is a valid outcome, not a failure.
"""

from __future__ import annotations

import msgspec

from pulse_adapters.maintenance._assessment import Assessment
from pulse_adapters.maintenance._settings import Budgets

NOTHING_TO_DO = "nothing safe to do this cycle"
CHANGED = "changes made"


class HealthSignal(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the seed's health table: the value, the healthy bound as text, whether it
    holds, and what to do when it does not. `None` values were not measurable here."""

    name: str
    value: int
    healthy_when: str
    healthy: bool
    if_exceeded: str


class CycleReport(msgspec.Struct, frozen=True, kw_only=True):
    """What one cycle did, stored whole in its activity-completed (or -failed).

    `reviewed`, `writes` (events appended) and `transactions` (appends) are what it spent of
    its budgets; `changes` counts what it changed by name; `assessment` holds the read-only
    counts it started from; `deferred` what it left for the next cycle and why;
    `needed_authority` what it would have done with a grant it lacks; `warnings` steps that
    raised (the cycle went on); `overdue` the overdue commitments it surfaced; `contested`
    the contested belief slots it found ("<identity>/<slot>"); `consumed_through` the change
    cursor its watch evaluation reached (the next cycle resumes there); `through_seq` the
    log's newest seq when it began.
    """

    cycle: str
    status: str
    trigger: str
    cycle_start: int
    ended_at: int
    outcome: str
    reviewed: int = 0
    writes: int = 0
    transactions: int = 0
    changes: dict[str, int] = {}
    assessment: Assessment = msgspec.field(default_factory=Assessment)
    deferred: tuple[str, ...] = ()
    needed_authority: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    overdue: tuple[str, ...] = ()
    contested: tuple[str, ...] = ()
    health: tuple[HealthSignal, ...] = ()
    steps: tuple[str, ...] = ()
    consumed_through: int = 0
    through_seq: int = 0
    swept_at: int | None = None

    def signal(self, name: str) -> HealthSignal:
        """The health signal `name`; KeyError names the ones there are."""
        for signal in self.health:
            if signal.name == name:
                return signal
        raise KeyError(f"no health signal {name!r}; have {[s.name for s in self.health]}")

    @property
    def healthy(self) -> bool:
        """Every health signal holds."""
        return all(s.healthy for s in self.health)


def health_signals(a: Assessment) -> tuple[HealthSignal, ...]:
    """The seed's health table (section 35) over assessment `a`, and the failed maintenance
    operations its metrics list names; the quarantine row counts imported elements flagged
    for review that no person has verified. Contested slots and stale artifacts are findings
    to review, never defects: contested slots are always reported as healthy (a finding),
    stale artifacts healthy when each has a review task, starved trials healthy when there
    are none."""
    return (
        HealthSignal(name="pending_sleep_tasks", value=a.pending_sleep_tasks,
                     healthy_when="< 10", healthy=a.pending_sleep_tasks < 10,
                     if_exceeded="process, or re-prioritize and report backlog"),
        HealthSignal(name="unconsolidated_events_older_than_7d", value=a.unconsolidated_old,
                     healthy_when="< 30", healthy=a.unconsolidated_old < 30,
                     if_exceeded="consolidate or set retention"),
        HealthSignal(name="contested_slots", value=a.contested_slots, healthy_when="audit all",
                     healthy=True, if_exceeded="review; contested is a finding, not a defect"),
        HealthSignal(name="skills_awaiting_verdict", value=a.skills_awaiting_verdict,
                     healthy_when="< 10", healthy=a.skills_awaiting_verdict < 10,
                     if_exceeded="run the deterministic verdict over linked outcomes"),
        HealthSignal(name="trials_starved_of_outcomes", value=a.trials_starved,
                     healthy_when="review all", healthy=a.trials_starved == 0,
                     if_exceeded="check that decisions are being recorded and observed"),
        HealthSignal(name="overdue_commitments", value=a.overdue_commitments,
                     healthy_when="0", healthy=a.overdue_commitments == 0,
                     if_exceeded="surface to the agent; never silently expire"),
        HealthSignal(name="armed_watches_past_due", value=a.watches_past_due,
                     healthy_when="0", healthy=a.watches_past_due == 0,
                     if_exceeded="fire or expire them; silence firing is the point"),
        HealthSignal(name="stale_artifacts", value=a.stale_derived,
                     healthy_when="review all", healthy=a.stale_unreviewed == 0,
                     if_exceeded="review_derived; stale is a flag, not a verdict"),
        HealthSignal(name="quarantined_imports", value=a.imports_flagged,
                     healthy_when="review all", healthy=a.imports_flagged == 0,
                     if_exceeded="review; never auto-elevate trust"),
        HealthSignal(name="elements_past_retention", value=a.retention_backlog,
                     healthy_when="0 unreviewed", healthy=a.retention_backlog == 0,
                     if_exceeded="review, then archive along the ladder"),
        HealthSignal(name="failed_sleep_tasks", value=a.failed_sleep_tasks,
                     healthy_when="review all", healthy=True,
                     if_exceeded="read the reasons; failed tasks stay visible"),
    )


class Budget:
    """What is left of one cycle's budgets; every step draws on the same one.

    A step asks before it writes (`allows`) and records what it spent (`spend`); it looks at
    no more elements than `review(n)` grants. What a step could not do within the budget it
    reports as deferred, and the next cycle does it. A resumed cycle's budget starts from
    what its earlier attempts spent (`reviewed`, `writes`, `transactions`).
    """

    def __init__(self, budgets: Budgets, *, reviewed: int = 0, writes: int = 0,
                 transactions: int = 0) -> None:
        self.limits = budgets
        self.reviewed = reviewed
        self.writes = writes
        self.transactions = transactions

    @property
    def elements_left(self) -> int:
        """Elements this cycle may still review."""
        return max(0, self.limits.max_elements_reviewed - self.reviewed)

    @property
    def writes_left(self) -> int:
        """Events this cycle may still append."""
        return max(0, self.limits.max_writes - self.writes)

    @property
    def transactions_left(self) -> int:
        """Appends this cycle may still make."""
        return max(0, self.limits.max_transactions - self.transactions)

    def allows(self, writes: int = 1, transactions: int = 1) -> bool:
        """Whether `writes` more events in `transactions` more appends fit."""
        return writes <= self.writes_left and transactions <= self.transactions_left

    def review(self, wanted: int) -> int:
        """Grant up to `wanted` element reviews; returns how many were granted."""
        granted = min(wanted, self.elements_left)
        self.reviewed += granted
        return granted

    def spend(self, *, writes: int = 0, transactions: int = 0) -> None:
        """Record events appended and appends made."""
        self.writes += writes
        self.transactions += transactions
