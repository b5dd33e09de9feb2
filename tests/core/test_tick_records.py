"""Tick records: every tick that writes keeps what it saw, and the same chain run again on a
record decides the same (hypothesis, over generated histories with restarts)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_core import (
    Decision,
    Engine,
    Event,
    EventDraft,
    Inner,
    LogFold,
    ManualClock,
    Mark,
    Projection,
    Snapshot,
    diff_effects,
    last_recorded,
    open_home,
    register_kind,
    replay_tick,
)

register_kind("test-message", "a message the tick-record tests count")


class Said(Mark, tag="test-said"):
    """What the rule under test noticed."""

    text: str


class Messages(Projection[int]):
    """How many test messages the log holds."""

    name = "test-messages"
    kinds = frozenset({"test-message"})

    def initial(self) -> int:
        return 0

    def apply(self, state: int, event: Event) -> int:
        return state + 1


def _level(snapshot: Snapshot) -> int:
    reading = snapshot.vital("level")
    return -1 if reading is None else int(reading.sample.data["v"])


async def notice(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    """Reads everything a snapshot holds: vitals of both, samples since the last tick, a
    projection of both, the log position and the interval before."""
    effects, tick_ms = await inner(prev, curr)
    level, count = _level(curr), curr.state(Messages)
    if level == 7:
        raise RuntimeError("seven is refused")
    if level > _level(prev):
        effects = [*effects, Said(text=f"up to {level} with {count} messages")]
    burst = curr.since_last_tick("level")
    if len(burst) > 1:
        effects = [*effects, Said(text=f"{len(burst)} readings: {[s.data['v'] for s in burst]}")]
    if count != prev.projections.get(Messages.name, 0) and curr.seq != prev.seq:
        effects = [*effects, Said(text=f"messages {prev.projections.get(Messages.name)} "
                                       f"-> {count} at #{curr.seq}")]
    return Decision(effects, tick_ms + count + curr.last_tick_ms % 7)


def _engine(home: Path, clock: ManualClock) -> Engine:
    return Engine(home, rules=[notice], projections=[Messages()], clock=clock,
                  default_tick_ms=1_000)


STEPS = st.lists(st.one_of(
    st.tuples(st.just("message"), st.integers(1, 3)),
    st.tuples(st.just("vital"), st.integers(0, 9)),
    st.tuples(st.just("tick"), st.just(0)),
    st.tuples(st.just("restart"), st.just(0)),
), min_size=1, max_size=25)


async def _history(home: Path, steps: list[tuple[str, int]]) -> int:
    """Run `steps` on an engine of `home`; the number of ticks that wrote something."""
    clock = ManualClock(1_000_000)
    engine = _engine(home, clock)
    await engine.open()
    wrote = 0
    try:
        for step, value in steps:
            clock.advance(250)
            if step == "message":
                await engine.append([EventDraft("test-message", "m", {"n": i})
                                     for i in range(value)])
            elif step == "vital":
                await engine.vitals.record("level", {"v": value})
            elif step == "tick":
                since = await engine.events.last_seq()
                await engine.tick()
                wrote += bool(await engine.events.read(since, kinds=["tick"]))
            else:
                await engine.close()
                engine = _engine(home, clock)
                await engine.open()
    finally:
        await engine.close()
    return wrote


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS)
def test_the_same_chain_replayed_on_any_record_decides_the_same(
        steps: list[tuple[str, int]]) -> None:
    async def run(home: Path) -> None:
        wrote = await _history(home, steps)
        stores = await open_home(home, read_only=True)
        try:
            records = await last_recorded(stores.events, stores.objects, 1_000)
            assert len(records) == wrote
            engine = _engine(home, ManualClock())  # built, never opened
            fold = LogFold(stores.events, engine.projection_list)
            for found in records:
                replayed = await replay_tick(engine.chain, fold, found.record)
                diff = diff_effects(found.record.effects, replayed.effects)
                assert diff.differs == 0, diff
                assert len(diff.same) == len(found.record.effects)
                assert replayed.tick_ms == found.record.tick_ms
                assert replayed.trace == found.record.trace
        finally:
            await stores.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(Path(tmp)))


async def test_a_record_holds_the_samples_since_the_last_tick_and_the_pending_keys(
        tmp_path: Path) -> None:
    clock = ManualClock(1_000_000)
    engine = _engine(tmp_path, clock)
    await engine.open()
    try:
        for v in (1, 2, 3):
            clock.advance(10)
            await engine.vitals.record("level", {"v": v})
        await engine.tick()
    finally:
        await engine.close()
    stores = await open_home(tmp_path, read_only=True)
    try:
        (found,) = await last_recorded(stores.events, stores.objects, 10)
    finally:
        await stores.close()
    record = found.record
    assert [s.data["v"] for s in record.curr.samples["level"]] == [1, 2, 3]
    assert record.curr.vitals["level"].sample.data == {"v": 3}
    assert record.prev.number == 0 and record.prev_folded == record.curr.seq
    assert [e.payload["text"] for e in record.effects] == [
        "up to 3 with 0 messages", "3 readings: [1, 2, 3]"]
    assert record.revision is None


async def test_an_engine_that_keeps_no_records_attaches_none(tmp_path: Path) -> None:
    engine = _engine(tmp_path, ManualClock(1_000_000))
    engine.ticker.records = False
    await engine.open()
    try:
        await engine.vitals.record("level", {"v": 1})
        await engine.tick()
        (tick,) = await engine.events.read(kinds=["tick"])
    finally:
        await engine.close()
    assert tick.hash is None
    assert not any(p.is_file() for p in (tmp_path / "objects").rglob("*"))
