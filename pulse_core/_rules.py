"""Rules as onion middleware over snapshots, their composition, and the built-in rules.

A rule receives the previous and current snapshots and `inner`, the rest of the chain. It may
pass through (`return await inner(prev, curr)`), bypass (return without calling inner),
decorate (call inner, then change the decision) or transform the snapshot it hands inward.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import msgspec

from pulse_core._effects import Effect
from pulse_core._errors import RuleChainError
from pulse_core._recent_errors import RecentErrors
from pulse_core._snapshot import Projection, Snapshot


class Decision(NamedTuple):
    """What the chain decided: effects to record, and how long to sleep before the next tick."""

    effects: list[Effect]
    tick_ms: int


Inner = Callable[[Snapshot, Snapshot], Awaitable[Decision]]
Rule = Callable[[Snapshot, Snapshot, Inner], Awaitable[Decision]]
ErrorSink = Callable[[str, BaseException], None]


def rule_name(rule: Any) -> str:
    """A rule's name for errors and events: its `name` attribute, else its function or class
    name; whitespace becomes '-' so the name can stand in an event origin."""
    name = getattr(rule, "name", None) or getattr(rule, "__name__", None) or type(rule).__name__
    return "-".join(str(name).split())


R = TypeVar("R")


def emits(*types: type[Effect]) -> Callable[[R], R]:
    """Declare the effect types a rule may return, so the engine (and the promote gate) can
    refuse a chain whose effects no executor handles: `@emits(Notify)` over the rule."""

    def declare(rule: R) -> R:
        rule.emits = types  # type: ignore[attr-defined]
        return rule

    return declare


def declared_effects(rule: Any) -> tuple[type[Effect], ...]:
    """The effect types `rule` declares with `emits` (or an `emits` attribute); () if none."""
    found = getattr(rule, "emits", ())
    return tuple(t for t in found if isinstance(t, type) and issubclass(t, Effect))


def check_decision(value: Any, where: str) -> Decision:
    """`value` as a Decision, or RuleChainError saying what was wrong with it."""
    if not isinstance(value, tuple) or len(value) != 2:
        raise RuleChainError(f"{where} returned {value!r}, not Decision(effects, tick_ms)")
    effects, tick_ms = value
    if not isinstance(tick_ms, int) or isinstance(tick_ms, bool) or tick_ms < 0:
        raise RuleChainError(f"{where} returned tick_ms={tick_ms!r}; need an int >= 0")
    if not isinstance(effects, list | tuple):
        raise RuleChainError(f"{where} returned effects={effects!r}; need a list of Effect")
    for i, effect in enumerate(effects):
        if not isinstance(effect, Effect):
            raise RuleChainError(f"{where} returned effects[{i}]={effect!r}, not an Effect")
    return Decision(list(effects), tick_ms)


def compose(rules: Sequence[Rule], default_tick_ms: int) -> Inner:
    """The chain of `rules`, outermost first, ending in `([], default_tick_ms)`.

    Raises RuleChainError now for a non-callable rule, and during a tick when a rule calls
    its `inner` twice.
    """
    for index, rule in enumerate(rules):
        if not callable(rule):
            raise RuleChainError(f"rule {index} ({rule!r}) is not callable")
    if not isinstance(default_tick_ms, int) or default_tick_ms < 0:
        raise RuleChainError(f"default_tick_ms must be an int >= 0, not {default_tick_ms!r}")

    async def terminal(prev: Snapshot, curr: Snapshot) -> Decision:
        return Decision([], default_tick_ms)

    chain: Inner = terminal
    for rule in reversed(rules):
        chain = _link(rule, chain)
    return chain


def _link(rule: Rule, nxt: Inner) -> Inner:
    name = rule_name(rule)

    async def step(prev: Snapshot, curr: Snapshot) -> Decision:
        called = False

        async def inner(p: Snapshot, c: Snapshot) -> Decision:
            nonlocal called
            if called:
                raise RuleChainError(f"rule {name!r} called inner twice in one tick")
            called = True
            return await nxt(p, c)

        return check_decision(await rule(prev, curr, inner), f"rule {name!r}")

    return step


def guarded(rule: Rule, on_error: ErrorSink) -> Rule:
    """`rule`, but an exception in it is reported to `on_error` and the tick passes through.

    If the rule had already called inner, inner's decision stands; otherwise inner is called
    now. So a broken rule can never silence the rules inside it, nor those outside.
    """
    name = rule_name(rule)

    async def run(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        outcome: Decision | None = None
        entered = False

        async def tracked(p: Snapshot, c: Snapshot) -> Decision:
            nonlocal outcome, entered
            entered = True
            outcome = await inner(p, c)
            return outcome

        try:
            return check_decision(await rule(prev, curr, tracked), f"rule {name!r}")
        except Exception as exc:
            on_error(name, exc)
            if outcome is not None:
                return outcome
            if entered:
                return Decision([], curr.last_tick_ms)
            return await inner(prev, curr)

    run.name = name  # type: ignore[attr-defined]
    return run


# -- built-in rules --------------------------------------------------------------------------


def clamp_tick(min_ms: int = 100, max_ms: int = 60_000) -> Rule:
    """Keep the inner chain's tick_ms within [min_ms, max_ms]."""
    if not 0 <= min_ms <= max_ms:
        raise ValueError(f"clamp_tick needs 0 <= min_ms <= max_ms, got {min_ms}, {max_ms}")

    async def clamp_tick(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        return Decision(effects, min(max(tick_ms, min_ms), max_ms))

    return clamp_tick


def error_backoff(
    window_ms: int = 60_000, factor: float = 2.0, max_ms: int = 60_000,
    projection: type[Projection[tuple[int, ...]]] = RecentErrors,
) -> Rule:
    """Slow the tick while errors keep coming: tick_ms * factor**n for n errors in the window.

    Reads the timestamps of recent errors from `projection` (the built-in RecentErrors).
    """

    async def error_backoff(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        recent = curr.state(projection) if projection.name in curr.projections else ()
        count = sum(1 for ts in recent if curr.at - ts <= window_ms)
        if count:
            tick_ms = int(min(max_ms, tick_ms * factor ** min(count, 32)))
        return Decision(effects, tick_ms)

    return error_backoff


def adaptive_interval(fast_ms: int = 1_000, slow_ms: int = 30_000, growth: float = 1.5) -> Rule:
    """Tick fast while the world moves (new events or effects), then slow down geometrically."""
    if not 0 < fast_ms <= slow_ms:
        raise ValueError(f"adaptive_interval needs 0 < fast_ms <= slow_ms: {fast_ms}, {slow_ms}")

    async def adaptive_interval(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        if effects or curr.seq != prev.seq:
            return Decision(effects, min(tick_ms, fast_ms))
        grown = int(max(curr.last_tick_ms, fast_ms) * growth)
        return Decision(effects, max(tick_ms, min(grown, slow_ms)))

    return adaptive_interval


def dedup() -> Rule:
    """Drop effects whose dedup key is already pending or executing, or repeated in this tick.

    An effect whose key cannot be computed (a field that cannot be encoded) is kept as it is:
    the engine drops it when it records the tick, with an `error` event naming it.
    """

    async def dedup(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        seen = set(curr.pending_effects)
        kept: list[Effect] = []
        for effect in effects:
            try:
                key = effect.dedup_key()
            except (TypeError, ValueError):
                kept.append(effect)
                continue
            if key not in seen:
                seen.add(key)
                kept.append(effect)
        return Decision(kept, tick_ms)

    return dedup


# -- the engine's chain ----------------------------------------------------------------------


class RuleTrace(msgspec.Struct, frozen=True):
    """What one rule did in the last tick: the effect tags and tick_ms it returned (None when
    it was never reached), and the error it raised."""

    rule: str
    tier: str
    reached: bool
    effects: tuple[str, ...] = ()
    tick_ms: int | None = None
    error: str | None = None


class RuleChain:
    """The engine's rules as tiers, outermost first, composed once.

    Every rule is guarded (an exception is reported and the tick passes through it). The
    last tier is the business tier: it is time-boxed to `business_timeout` seconds a tick
    (past it, its decision is dropped and reported) and can be replaced between ticks.
    `run` returns the decision, the errors of that run, and a trace of every rule.
    """

    def __init__(
        self,
        tiers: Sequence[tuple[str, Sequence[Rule]]],
        *,
        default_tick_ms: int,
        business_timeout: float,
    ) -> None:
        *fixed, (business_tier, business) = tiers or [("business", ())]
        self.default_tick_ms = default_tick_ms
        self.business_timeout = business_timeout
        self.business_tier = business_tier
        self._errors: list[tuple[str, BaseException]] = []
        self._trace: dict[str, RuleTrace] = {}
        self._fixed: list[tuple[str, str]] = [(tier, rule_name(r)) for tier, rules in fixed
                                              for r in rules]
        links = [self._traced(tier, r) for tier, rules in fixed for r in rules]
        self._outer: Inner = compose([*links, self._time_boxed()], default_tick_ms)
        self._business_names: list[str] = []
        self._business: Inner = self._compose_business(business)

    @property
    def names(self) -> tuple[str, ...]:
        """Every rule's name, outermost first."""
        return (*(name for _, name in self._fixed), *self._business_names)

    @property
    def tiers(self) -> list[tuple[str, str]]:
        """(tier, rule name) for every rule, outermost first."""
        return [*self._fixed, *((self.business_tier, n) for n in self._business_names)]

    def _traced(self, tier: str, rule: Rule) -> Rule:
        name = rule_name(rule)

        def failed(_: str, exc: BaseException) -> None:
            self._errors.append((f"rule:{name}", exc))
            self._trace[name] = RuleTrace(name, tier, True,
                                          error=f"{type(exc).__name__}: {exc}")

        safe = guarded(rule, failed)

        async def traced(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
            decision = await safe(prev, curr, inner)
            if name not in self._trace:
                self._trace[name] = RuleTrace(
                    name, tier, True, tuple(type(e).tag() for e in decision.effects),
                    decision.tick_ms)
            return decision

        traced.name = name  # type: ignore[attr-defined]
        return traced

    def _compose_business(self, rules: Sequence[Rule]) -> Inner:
        chain = compose([self._traced(self.business_tier, r) for r in rules],
                        self.default_tick_ms)
        self._business_names = [rule_name(r) for r in rules]
        return chain

    def replace_business(self, rules: Sequence[Rule]) -> None:
        """Swap the business tier (call between ticks); RuleChainError keeps the old one."""
        names = self._business_names
        try:
            self._business = self._compose_business(rules)
        except BaseException:
            self._business_names = names
            raise

    def _time_boxed(self) -> Rule:
        async def business_rules(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
            try:
                async with asyncio.timeout(self.business_timeout):
                    return await self._business(prev, curr)
            except TimeoutError:
                self._errors.append(("rule:business-rules", TimeoutError(
                    f"business rules took longer than {self.business_timeout:g} s; their "
                    "decision was dropped for this tick")))
                return await inner(prev, curr)

        return business_rules

    async def run(self, prev: Snapshot, curr: Snapshot
                  ) -> tuple[Decision, list[tuple[str, BaseException]], list[RuleTrace]]:
        """One pass of the chain: the decision, errors (where, exception), the trace."""
        self._errors, self._trace = [], {}
        decision = await self._outer(prev, curr)
        errors, trace = self._errors, self._trace
        self._errors, self._trace = [], {}
        return decision, errors, [trace.get(name) or RuleTrace(name, tier, False)
                                  for tier, name in self.tiers]
