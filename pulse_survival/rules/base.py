"""What every survival rule shares: its place in the chain, the ledger, and the samples it
may act on."""

from __future__ import annotations

import abc
from typing import ClassVar

from pulse_core import Decision, Effect, Inner, Mark, Sample, Snapshot
from pulse_survival.ledger import SurvivalLedger, SurvivalLedgerData
from pulse_survival.marks import StreakCounted


class SurvivalRule(abc.ABC):
    """A survival rule: a Rule callable with a fixed name and place in the chain.

    `emits` names the effects it may return for executors (its marks need none). It keeps
    no state of its own: what it must remember it returns as marks, and reads back from the
    ledger (`ledger(curr)`).
    """

    name: ClassVar[str]
    emits: ClassVar[tuple[type[Effect], ...]] = ()

    @abc.abstractmethod
    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        """Decide, around the rules inside this one."""


def ledger(snapshot: Snapshot) -> SurvivalLedgerData:
    """The survival ledger in a snapshot."""
    return snapshot.state(SurvivalLedger)


def latest(snapshot: Snapshot, key: str) -> Sample | None:
    """The newest sample of `key` this engine took (None before its first one): the last of
    those since the previous tick, else the reading of an earlier tick. The engine hands a
    tick only samples it took itself: one left by an earlier run is never here."""
    recent = snapshot.since_last_tick(key)
    if recent:
        return recent[-1]
    reading = snapshot.vital(key)
    return None if reading is None else reading.sample


def counted(streak: int, condition: bool, enough: int) -> int:
    """The streak after one more sample: one longer while `condition` holds (never past
    `enough`, all a rule needs to know), else zero."""
    return min(streak + 1, enough) if condition else 0


def streak_marks(rule: str, before: int, after: int) -> list[Mark]:
    """The mark that records a streak's new length, if it changed."""
    return [StreakCounted(rule=rule, count=after)] if after != before else []
