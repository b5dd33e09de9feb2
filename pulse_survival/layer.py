"""The slot the Engine fills its outermost rules, watchers and executors from."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from pulse_core.effects import Executor
    from pulse_core.rules import Rule
    from pulse_core.watch import Watcher


class SurvivalLayer(NamedTuple):
    """What the survival layer adds to every engine; user code cannot remove any of it."""

    watchers: tuple[Watcher, ...]
    rules: tuple[Rule, ...]
    executors: tuple[Executor, ...]


def survival_layer() -> SurvivalLayer:
    """The survival layer's parts, outermost rule first. Empty until the survival issue."""
    return SurvivalLayer((), (), ())
