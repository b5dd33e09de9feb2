"""What a tick sees: the log folded by projections, and the vitals sampled since the last tick."""

from __future__ import annotations

import abc
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

import msgspec

from pulse_core._events import Event
from pulse_core.store import Sample

S = TypeVar("S")


class Projection(abc.ABC, Generic[S]):
    """A fold of the log into a current form: `apply(state, event) -> new state`.

    `apply` must return a new state rather than change the one it is given: the previous
    snapshot still holds it. `kinds` limits which events reach `apply`. Bump `version` when
    `apply` changes meaning, so checkpoints of the old fold are discarded and rebuilt.
    """

    name: ClassVar[str]
    kinds: ClassVar[frozenset[str] | None] = None
    version: ClassVar[int] = 1

    @abc.abstractmethod
    def initial(self) -> S:
        """The state before any event."""

    @abc.abstractmethod
    def apply(self, state: S, event: Event) -> S:
        """The state after `event`."""

    def apply_all(self, state: S, events: Sequence[Event]) -> S:
        """The state after `events`, in order: `apply` of each. A projection may fold a page
        at once instead, to the same state."""
        for event in events:
            state = self.apply(state, event)
        return state

    def state_type(self) -> Any:
        """The type checkpoints decode the state into: `initial`'s return annotation."""
        hints = typing.get_type_hints(type(self).initial)
        return hints.get("return", Any)


class VitalReading(msgspec.Struct, frozen=True, gc=False):
    """The latest sample of a vitals key and how old it was when the snapshot was taken."""

    sample: Sample
    age_ms: int


class Snapshot(msgspec.Struct, frozen=True):
    """What one tick sees: the log up to `seq`, vitals, and every projection's state.

    `vitals` holds the latest reading of each key, and `samples` every sample recorded since
    the previous tick (oldest first); both hold only samples taken since this engine started,
    so a reading left by an earlier run never triggers an action. `started_at` is when this
    engine opened: a `prev` with `at < started_at` was persisted by an earlier run, and a
    `prev` with `number == 0` means this is the first tick ever. `pending_effects` holds the
    dedup keys of effects not yet acked or finally failed; `last_tick_ms` is the interval the
    previous tick chose.
    """

    seq: int
    at: int
    number: int
    vitals: Mapping[str, VitalReading]
    projections: Mapping[str, Any]
    pending_effects: frozenset[str] = frozenset()
    last_tick_ms: int = 0
    samples: Mapping[str, tuple[Sample, ...]] = {}
    started_at: int = 0

    def projection(self, name: str) -> Any:
        """The state of projection `name`; KeyError names the ones that exist."""
        try:
            return self.projections[name]
        except KeyError:
            raise KeyError(f"no projection {name!r}; have {sorted(self.projections)}") from None

    def state(self, projection: type[Projection[S]]) -> S:
        """The state of the projection class `projection`, typed: `curr.state(Memory)`."""
        value: S = self.projection(projection.name)
        return value

    def vital(self, key: str) -> VitalReading | None:
        """The latest reading of `key` taken by this engine, if any."""
        return self.vitals.get(key)

    def since_last_tick(self, key: str) -> tuple[Sample, ...]:
        """Every sample of `key` recorded since the previous tick, oldest first."""
        return self.samples.get(key, ())
