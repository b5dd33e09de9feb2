"""compose(), guarded() and the built-in rules, on hand-made snapshots."""

from __future__ import annotations

from typing import Any

import pytest

from pulse_core import (
    Decision,
    Effect,
    Inner,
    RuleChainError,
    Snapshot,
    adaptive_interval,
    clamp_tick,
    compose,
    dedup,
    error_backoff,
    guarded,
)


class Say(Effect, tag="rules-say"):
    text: str


def snap(seq: int = 1, at: int = 100_000, **kw: Any) -> Snapshot:
    return Snapshot(seq=seq, at=at, number=1, vitals={}, projections=kw.pop("projections", {}),
                    **kw)


def emitting(text: str) -> Any:
    async def rule(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick = await inner(prev, curr)
        return Decision([*effects, Say(text=text)], tick)

    rule.__name__ = f"say_{text}"
    return rule


async def test_compose_runs_outermost_first_and_ends_in_the_default() -> None:
    order: list[str] = []

    def tracing(name: str) -> Any:
        async def rule(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
            order.append(f"enter {name}")
            decision = await inner(prev, curr)
            order.append(f"leave {name}")
            return decision

        return rule

    chain = compose([tracing("outer"), tracing("inner")], 1234)
    assert await chain(snap(), snap()) == Decision([], 1234)
    assert order == ["enter outer", "enter inner", "leave inner", "leave outer"]


async def test_a_rule_can_bypass_decorate_and_transform() -> None:
    async def bypass(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        return Decision([Say(text="bypass")], 10)

    assert await compose([bypass, emitting("never")], 99)(snap(), snap()) == Decision(
        [Say(text="bypass")], 10)

    async def transform(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        return await inner(prev, snap(seq=42))

    async def read_seq(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        return Decision([Say(text=str(curr.seq))], 5)

    decision = await compose([emitting("outer"), transform, read_seq], 99)(snap(), snap())
    assert decision == Decision([Say(text="42"), Say(text="outer")], 5)


def test_compose_refuses_a_rule_that_is_not_callable() -> None:
    with pytest.raises(RuleChainError, match="rule 1"):
        compose([emitting("a"), "not a rule"], 100)  # type: ignore[list-item]


async def test_calling_inner_twice_is_an_error() -> None:
    async def greedy(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        await inner(prev, curr)
        return await inner(prev, curr)

    with pytest.raises(RuleChainError, match=r"greedy.*twice"):
        await compose([greedy], 100)(snap(), snap())


async def test_a_rule_returning_garbage_is_an_error() -> None:
    async def sloppy(prev: Snapshot, curr: Snapshot, inner: Inner) -> Any:
        return ["effects"], "soon"

    with pytest.raises(RuleChainError, match="sloppy"):
        await compose([sloppy], 100)(snap(), snap())


async def test_a_rule_that_raises_does_not_stop_the_rules_outside_or_inside_it() -> None:
    errors: list[tuple[str, BaseException]] = []

    def sink(name: str, exc: BaseException) -> None:
        errors.append((name, exc))

    async def broken(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        raise ValueError("business logic bug")

    async def broken_after_inner(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        await inner(prev, curr)
        raise KeyError("late bug")

    rules = [emitting("survival"), broken, broken_after_inner, emitting("innermost")]
    chain = compose([guarded(r, sink) for r in rules], 100)
    decision = await chain(snap(), snap())
    assert [e.text for e in decision.effects] == ["innermost", "survival"]  # type: ignore[attr-defined]
    assert [(n, type(e)) for n, e in errors] == [
        ("broken", ValueError), ("broken_after_inner", KeyError)]


async def test_clamp_tick_bounds_the_inner_tick() -> None:
    async def fast(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        return Decision([], 1)

    assert (await compose([clamp_tick(50, 500), fast], 0)(snap(), snap())).tick_ms == 50
    assert (await compose([clamp_tick(50, 500)], 10_000)(snap(), snap())).tick_ms == 500
    with pytest.raises(ValueError):
        clamp_tick(10, 5)


async def test_error_backoff_lengthens_the_tick_for_recent_errors_only() -> None:
    rule = compose([error_backoff(window_ms=1_000, factor=2.0, max_ms=10_000)], 1_000)
    now = 100_000
    quiet = snap(at=now, projections={"errors": (now - 5_000,)})
    assert (await rule(quiet, quiet)).tick_ms == 1_000
    noisy = snap(at=now, projections={"errors": (now - 500, now - 100)})
    assert (await rule(noisy, noisy)).tick_ms == 4_000
    storm = snap(at=now, projections={"errors": tuple(range(now - 900, now))})
    assert (await rule(storm, storm)).tick_ms == 10_000


async def test_adaptive_interval_is_fast_while_things_move_then_slows() -> None:
    rule = compose([adaptive_interval(fast_ms=100, slow_ms=1_000, growth=2.0)], 5_000)
    assert (await rule(snap(seq=1), snap(seq=2))).tick_ms == 100
    quiet = compose([adaptive_interval(fast_ms=100, slow_ms=1_000, growth=2.0)], 50)
    assert (await quiet(snap(seq=2), snap(seq=2, last_tick_ms=400))).tick_ms == 800
    assert (await quiet(snap(seq=2), snap(seq=2, last_tick_ms=800))).tick_ms == 1_000
    busy = compose([adaptive_interval(100, 1_000), emitting("x")], 5_000)
    assert (await busy(snap(seq=2), snap(seq=2, last_tick_ms=1_000))).tick_ms == 100


async def test_dedup_drops_effects_already_pending_or_repeated() -> None:
    pending = Say(text="pending").dedup_key()
    chain = compose([dedup(), emitting("new"), emitting("new"), emitting("pending")], 100)
    decision = await chain(snap(), snap(pending_effects=frozenset({pending})))
    assert decision.effects == [Say(text="new")]


def test_an_error_recorded_late_counts_when_it_was_reported_not_when_it_was_stored() -> None:
    from pulse_core import Event, RecentErrors

    def error(seq: int, ts: int, **data: object) -> Event:
        return Event(seq, f"e{seq}", "error", "engine", seq, ts, "engine", None, "tx", None,
                     {"error": "x", **data}, None)

    errors = RecentErrors()
    state = errors.initial()
    state = errors.apply(state, error(1, 5_000))
    state = errors.apply(state, error(2, 90_000, late=True, reported_at=3_000))
    state = errors.apply(state, error(3, 91_000, late=True, reported_at=95_000))  # not late
    state = errors.apply(state, error(4, 92_000, reported_at=1_000))  # not marked late
    assert state == (3_000, 5_000, 91_000, 92_000)


async def test_a_services_failures_never_slow_the_ticks() -> None:
    from pulse_core import Event, RecentErrors

    def error(seq: int, key: str) -> Event:
        return Event(seq, f"e{seq}", "error", key, 1, 1_000 + seq, "engine", None, "tx", None,
                     {"error": "x"}, None)

    errors = RecentErrors()
    state = errors.initial()
    for seq in range(1, 21):  # the web UI's process failing again and again
        state = errors.apply(state, error(seq, "service:web"))
    assert state == ()
    state = errors.apply(state, error(21, "rule:mine"))
    assert state == (1_021,)
    decision = await compose([error_backoff()], 5_000)(
        snap(), snap(projections={"errors": errors.apply((), error(1, "service:web"))}))
    assert decision.tick_ms == 5_000
