"""What every survival rule shares: its place in the chain and monit-style streak counting."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from pulse_core import Decision, Inner, Sample, Snapshot
from pulse_survival.ledger import SurvivalLedgerData


class Streak:
    """Counts consecutive distinct samples that meet a condition (`for N cycles`).

    Unlike monit (its bug #1030) the count starts again from zero once the action fires.
    """

    def __init__(self) -> None:
        self.count = 0
        self._last_ts: int | None = None

    def feed(self, sample: Sample | None, condition: bool) -> int:
        """Count `sample` once (a sample seen before changes nothing); returns the streak."""
        if sample is None or sample.ts == self._last_ts:
            return self.count
        self._last_ts = sample.ts
        self.count = self.count + 1 if condition else 0
        return self.count

    def fired(self) -> None:
        """The action fired: count again from zero."""
        self.count = 0


class SurvivalRule(abc.ABC):
    """A survival rule: a Rule callable with a fixed name and place in the chain."""

    name: ClassVar[str]

    @abc.abstractmethod
    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        """Decide, around the rules inside this one."""


def ledger(snapshot: Snapshot) -> SurvivalLedgerData:
    """The survival ledger in a snapshot."""
    state: Any = snapshot.projections.get("survival")
    return state if isinstance(state, SurvivalLedgerData) else SurvivalLedgerData()


def latest(snapshot: Snapshot, key: str) -> Sample | None:
    """The newest sample of a vitals key, if any."""
    reading = snapshot.vital(key)
    return reading.sample if reading is not None else None
