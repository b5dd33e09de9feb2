"""What the engine tells its UI process every beat: the part of its state that is not in the
log (ticks, loops, the last tick's trace), one JSON line on the child's stdin."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from pulse_adapters.web._metrics import InstrumentReadings
from pulse_core import LoopStatus, RuleTrace, declared_effects

if TYPE_CHECKING:
    from pulse_core import Engine


class EngineReport(msgspec.Struct, frozen=True, kw_only=True):
    """The running engine as the UI shows it, at `now` (engine clock, ms)."""

    now: int = 0
    ticks: int = 0
    last_tick_at: int | None = None
    last_tick_ms: int = 0
    next_tick_at: int | None = None
    started_at: int = 0
    placement: str = ""
    loops: tuple[LoopStatus, ...] = ()
    trace: tuple[RuleTrace, ...] = ()
    rules: tuple[str, ...] = ()
    survival_tags: tuple[str, ...] = ()
    watchers: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()
    has_directory: bool = False
    instruments: InstrumentReadings = msgspec.field(default_factory=InstrumentReadings)


def survival_tags(engine: Engine) -> tuple[str, ...]:
    """The effect and mark types the survival layer's rules make."""
    layer = engine.survival
    types = {t for rule in layer.rules for t in declared_effects(rule)} | set(layer.emits)
    return tuple(sorted(t.tag() for t in types))


TEXT_MAX = 2_000
"""The longest error text a report carries (a rule may raise with megabytes of text)."""


def _clipped(text: str | None) -> str | None:
    return text if text is None or len(text) <= TEXT_MAX else text[:TEXT_MAX] + "…"


def _trace(engine: Engine) -> tuple[RuleTrace, ...]:
    """The last tick's trace; before the first tick, every rule in its tier, not reached."""
    if engine.trace:
        return tuple(msgspec.structs.replace(t, error=_clipped(t.error)) for t in engine.trace)
    return tuple(RuleTrace(name, tier, reached=False) for tier, name in engine.chain.tiers)


async def report_of(engine: Engine, has_directory: bool,
                    instruments: InstrumentReadings) -> EngineReport:
    """`engine` now, with what its instruments measured."""
    return EngineReport(
        now=engine.clock.now_ms(), ticks=engine.ticks, last_tick_at=engine.last_tick_at,
        last_tick_ms=engine.last_tick_ms, next_tick_at=engine.next_tick_at,
        started_at=engine.started_at, placement=engine.placement,
        loops=tuple(msgspec.structs.replace(loop, last_error=_clipped(loop.last_error))
                    for loop in engine.loops()), trace=_trace(engine), rules=engine.rule_names,
        survival_tags=survival_tags(engine),
        watchers=tuple(w.key for w in engine.watchers),
        layers=tuple(layer.name for layer in engine.layers), has_directory=has_directory,
        instruments=instruments)
