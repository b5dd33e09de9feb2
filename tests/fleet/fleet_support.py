"""What the fleet tests share: engine host processes, bounded waits, and the check of a whole
log against the journal its executors wrote."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pulse_core import Event
from pulse_core._effects import effect_draft
from pulse_core._lease import owner_host
from pulse_core.store import EventStore
from tests.e2e.support import Child, fail_if_stuck
from tests.fleet.engine_host import Execution, Work
from tests.timing import scaled

HOST_SCRIPT = str(Path(__file__).resolve().parent / "engine_host.py")
OUTCOMES = ("effect-acked", "effect-failed")


@contextmanager
def host_processes(tmp_path: Path) -> Iterator[Callable[..., Child]]:
    """A starter of engine host processes (home tmp_path/<host>, journal tmp_path/journal);
    every one still running at the end is killed."""
    hosts: list[Child] = []

    def start(host: str, store: str, *options: str) -> Child:
        child = Child(HOST_SCRIPT, [str(tmp_path / host), store, "--host", host, "--journal",
                                    str(tmp_path / "journal"), *options], tmp_path)
        hosts.append(child)
        return child

    yield start
    for child in hosts:
        child.close()


async def until(probe: Callable[[], Awaitable[object]], within: float, what: str,
                *children: Child) -> None:
    """Await `probe()` until it is truthy; fail after `within` seconds (scaled: it bounds a
    hang), or as soon as one of `children` has died."""
    within = scaled(within)
    deadline = time.monotonic() + within
    while not await probe():
        fail_if_stuck(deadline, within, what, children)
        await asyncio.sleep(0.1)


async def ready(*hosts: Child) -> None:
    """Wait until every host printed `ready`."""
    await asyncio.gather(*(asyncio.to_thread(h.wait_for_line, "ready", 90) for h in hosts))


async def append_work(store: EventStore, count: int, per_append: int = 50) -> None:
    """Append `count` Work effects, `per_append` to an append, as an agent would."""
    for first in range(0, count, per_append):
        await store.append([effect_draft(Work(n=n), origin="agent")
                            for n in range(first, min(first + per_append, count))])


async def acked_work(store: EventStore) -> int:
    """How many Work effects have an ack (read from the log)."""
    return len(await store.read(kinds=["effect-acked"]))


@dataclass(frozen=True)
class FleetRun:
    """What the log and the journal say about a run: the effects, the attempts claimed and
    never finished (`abandoned`, by host), the executions repeated because of them."""

    effects: int
    claims: int
    executions: int
    abandoned: Counter[str]
    repeated: int


def check_effects(events: list[Event], executions: list[Execution]) -> FleetRun:
    """Assert what a fleet promises of a whole log and its journal, and return the counts.

    - seq is gap-free and no event id repeats;
    - every effect is acked exactly once and never failed for good;
    - no (effect, attempt) is claimed twice, and every outcome answers a claim of its attempt;
    - every execution the journal records ran under a claim of its own, at most once per
      (effect, attempt), and every acked attempt was executed;
    - an attempt claimed and never finished (its host died) is claimed again only once its
      lease has ended, and that effect is acked by a later attempt.
    """
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "seq has gaps"
    assert len({e.id for e in events}) == len(events), "an event id repeats"
    effects = {e.key for e in events if e.kind == "effect"}
    claims: dict[tuple[str, int], Event] = {}
    outcomes: dict[tuple[str, int], Event] = {}
    acks: Counter[str] = Counter()
    for event in events:
        if not event.kind.startswith("effect-"):
            continue
        which: tuple[str, int] = (event.key, event.data["attempt"])
        if event.kind == "effect-executing":
            assert which not in claims, f"attempt claimed twice: {which}"
            claims[which] = event
        elif event.kind in OUTCOMES:
            assert which in claims, f"an outcome of an attempt never claimed: {which}"
            assert which not in outcomes, f"an attempt finished twice: {which}"
            outcomes[which] = event
            assert not (event.kind == "effect-failed" and event.data.get("final")), event
            acks[event.key] += event.kind == "effect-acked"
    assert set(acks) == effects and set(acks.values()) == {1}, (
        f"not acked exactly once: {sorted(k for k in effects if acks[k] != 1)[:10]}")
    ran = Counter((x.effect_id, x.attempt) for x in executions)
    assert set(ran) <= set(claims), "an execution no claim allowed"
    assert set(ran.values()) == {1}, "an (effect, attempt) executed twice"
    acked = {a for a, e in outcomes.items() if e.kind == "effect-acked"}
    assert acked <= set(ran), "an attempt acked without being executed"
    abandoned: Counter[str] = Counter()
    for (key, attempt), claim in claims.items():
        if (key, attempt) in outcomes:
            continue
        after = claims.get((key, attempt + 1))
        assert after is not None, f"attempt {attempt} of {key} abandoned and never claimed again"
        assert after.ts >= claim.data["lease_until"], (
            f"attempt {attempt + 1} of {key} claimed before attempt {attempt}'s lease ended")
        abandoned[owner_host(claim.data["owner"])] += 1
    repeated = len(executions) - len({x.effect_id for x in executions})
    return FleetRun(len(effects), len(claims), len(executions), abandoned, repeated)


