"""The engine's loop while another process holds events.db's write lock for seconds.

    python -m bench.stall [--hold 3] [--ticks-every 10]

An Engine with the survival layer watching one essential process ticks every `--ticks-every`
ms beside a heartbeat coroutine (a 1 ms sleep, over and over). A second process takes
`BEGIN EXCLUSIVE` on the same events.db and holds it for `--hold` seconds. Measured before
the hold (the limit: the same engine, the same loop, the same run) and during it:

- loop lag: how much later than asked each heartbeat woke (p99 and the longest);
- `engine.tick()` with nothing to write (the process is seen alive), p50 and p99;
- a survival decision: the process is seen dead and a tick runs; the time until the rule
  chain has decided its restart (the decision is made at once; the tick's append of it waits
  for the lock in the writer thread, off the loop, and is stored when the lock is let go);
- after the hold: single-draft appends, p50, beside the same appends before it;
- then a stalled disk: SQLite's writes in this process held back for `--hold` seconds
  (`bench.disk.WriteGate`: its `write`/`pwrite64` wait, as on a disk that stopped answering)
  while a lone append waits for its commit: loop lag, quiet ticks, when the append returned;
  and a second stall of half as long that a survival decision (its dead sample stored just
  before) is made in, its record waiting for the disk;
- loop lag while one coroutine appends alone (5 x `--appends` single drafts) with the
  store's default bound (the loop's thread waits for each lone commit up to
  `inline_commit`), beside the same with `inline_commit=0` (every commit in the writer
  thread, the loop never waiting): what waiting for commits costs the loop.

Floors: the longest loop stall during the hold < 5% of the hold (a loop waiting on the lock
would stop for all of it), and tick p99 during the hold <= 3 x tick p99 before it; the same
two for the stalled disk (a commit on the loop that met it would stop the loop for all of
it).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import Figure, Floor, Report, percentile, temp_dir, tick_drafts
from bench.disk import WriteGate
from pulse_core import Decision, Engine
from pulse_core.store import SqliteEventStore
from pulse_survival import Essential, ProcessPolicy, SurvivalConfig

NAMES = ("w", "v", "u")
# The store's default bound on inline commits, as its signature gives it.
INLINE_COMMIT: float = inspect.signature(SqliteEventStore.open).parameters[
    "inline_commit"].default
HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN EXCLUSIVE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
print("released", flush=True)
"""


def config() -> SurvivalConfig:
    """Essential processes nothing here matches: one dies before the hold, one during it,
    one while the disk stalls."""
    specs = tuple(Essential(name=name, argv=(sys.executable, "-c", "pass", uuid.uuid4().hex),
                            match_name=f"no-such-{name}") for name in NAMES)
    return SurvivalConfig(processes=specs, process=ProcessPolicy(
        startsecs=1, startretries=3, budget_per_hour=50, backoff_initial_s=1,
        backoff_max_s=60))


class Phase:
    """What the loop did during one window."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.ticks: list[float] = []


async def alive(engine: Engine, dead: str | None = None) -> None:
    """A process-alive sample: every process up, except `dead`."""
    await engine.vitals.record("process-alive", {name: {
        "alive": name != dead, "pid": None if name == dead else 4242,
        "uptime_s": 0.0 if name == dead else 3600.0, "restarts_seen": 0} for name in NAMES})


async def window(engine: Engine, seconds: float, every_ms: float, *, ticks: bool = True
                 ) -> Phase:
    """Heartbeats and (unless not `ticks`) quiet ticks for `seconds`."""
    phase = Phase()
    end = time.perf_counter() + seconds

    async def heartbeat() -> None:
        while time.perf_counter() < end:
            asked = time.perf_counter()
            await asyncio.sleep(0.001)
            phase.lags.append(max(0.0, time.perf_counter() - asked - 0.001))

    async def ticker() -> None:
        while ticks and time.perf_counter() < end:
            t0 = time.perf_counter()
            await engine.tick()
            phase.ticks.append(time.perf_counter() - t0)
            await asyncio.sleep(every_ms / 1000)

    await asyncio.gather(heartbeat(), ticker())
    return phase


async def decide(engine: Engine, dead: str, *, sampled: bool = False
                 ) -> tuple[float, asyncio.Task[Decision]]:
    """Seconds from `dead`'s dead sample (recorded here unless `sampled` already) until the
    chain has decided; the tick (its append may wait)."""
    before = engine.ticker.trace
    t0 = time.perf_counter()
    if not sampled:
        await alive(engine, dead)
    tick = asyncio.create_task(engine.tick())
    # Polled each loop turn (no event marks the chain's end): the moment it decided.
    while engine.ticker.trace is before and not tick.done():  # noqa: ASYNC110
        await asyncio.sleep(0)
    return time.perf_counter() - t0, tick


@dataclass(frozen=True)
class DiskStall:
    """What the loop did while SQLite's writes were held back."""

    phase: Phase  # the first stall: heartbeats and quiet ticks beside a waiting append
    appended: float  # seconds until that append returned
    lags_deciding: list[float]  # heartbeats of the second stall
    decided: float  # seconds from its tick's start to the restart decided
    decision: Decision
    writes_held: int


async def disk_stall(engine: Engine, gate: WriteGate, seconds: float, every_ms: float
                     ) -> DiskStall:
    """A stall of `seconds` with a lone append waiting for its commit and quiet ticks beside
    it; then one of `seconds` / 2 in which `u`, seen dead just before, is decided on."""
    # Opened by a thread: a loop stuck in a write could not open it.
    reopen = threading.Timer(seconds, gate.open)
    gate.shut()
    reopen.start()
    t0 = time.perf_counter()
    waiting = asyncio.create_task(engine.append(tick_drafts(10**6, 1, 1)))
    phase = await window(engine, seconds, every_ms)
    await waiting
    appended = time.perf_counter() - t0
    await alive(engine, "u")  # a sample taken during the stall would wait for the disk
    reopen = threading.Timer(seconds / 2, gate.open)
    gate.shut()
    reopen.start()
    beating = asyncio.create_task(window(engine, seconds / 2, every_ms, ticks=False))
    decided, tick = await decide(engine, "u", sampled=True)
    deciding = await beating
    decision = await tick
    return DiskStall(phase, appended, deciding.lags, decided, decision, gate.writes_held)


async def stalled_disk(engine: Engine, seconds: float, every_ms: float) -> DiskStall | None:
    """`disk_stall` when SQLite's writes can be held back here, else None."""
    if not WriteGate.available():
        return None
    await alive(engine)
    await engine.tick()
    with WriteGate() as gate:
        return await disk_stall(engine, gate, seconds, every_ms)


def report_disk_stall(report: Report, stall: DiskStall | None, seconds: float,
                      before: Phase, decided_before: float) -> None:
    """The stalled disk's lines, beside the same figures before the lock hold."""
    if stall is None:
        report.note("stalled disk: skipped (SQLite's write hooks cannot be reached through "
                    "ctypes here)")
        return
    lags = stall.phase.lags + stall.lags_deciding
    report.compare(_ms("longest loop stall while the disk stalls", max(lags)),
                   _ms("the stall", seconds),
                   floor=Floor.ratio_at_most(max(lags) / seconds, 0.05))
    tick_p99, tick_p99_before = percentile(stall.phase.ticks, 99), percentile(before.ticks, 99)
    report.compare(_ms("quiet engine.tick() p99 while the disk stalls", tick_p99),
                   _ms("quiet engine.tick() p99 before the hold", tick_p99_before),
                   floor=Floor.ratio_at_most(tick_p99 / tick_p99_before, 3.0))
    report.compare(_ms("survival decision while the disk stalls (tick start to decided; "
                       "the sample stored before)", stall.decided),
                   _ms("dead sample to decided before the hold", decided_before))
    report.compare(_ms("the lone append that met the stall returned after", stall.appended),
                   _ms("the stall", seconds))
    report.note(f"stalled disk: {len(stall.phase.ticks)} quiet ticks during it; SQLite writes "
                f"held back: {stall.writes_held}; restarts decided in the second stall: "
                f"{restarts(stall.decision)} (its record stored once writes went through)")


async def lag_while_appending(path: Path, count: int, inline_commit: float) -> list[float]:
    """Heartbeat lags (s) while one coroutine makes `count` single-draft appends alone."""
    store = await SqliteEventStore.open(path, inline_commit=inline_commit)
    lags: list[float] = []
    done = False

    async def heartbeat() -> None:
        while not done:
            asked = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(max(0.0, time.perf_counter() - asked - 0.001))

    beating = asyncio.create_task(heartbeat())
    try:
        for draft in tick_drafts(0, count, 100):
            await store.append([draft])
    finally:
        done = True
        await beating
        await store.close()
    return lags


def compare_lags(report: Report, inline_lags: list[float], thread_lags: list[float]) -> None:
    """The loop's lag while one coroutine appends alone, inline commits beside thread ones."""
    report.compare(_ms("loop lag p99 while one coroutine appends alone (lone commits "
                       "waited for)", percentile(inline_lags, 99)),
                   _ms("the same, every commit in the writer thread", percentile(thread_lags, 99)))
    report.compare(_ms("longest loop stall while one coroutine appends alone (lone commits "
                       "waited for)", max(inline_lags)),
                   _ms("the same, every commit in the writer thread", max(thread_lags)))
    report.note("the price of waiting for lone commits: the loop's thread waits for each "
                f"one, at most inline_commit={INLINE_COMMIT:g} s (a slower commit is handed "
                "back to the loop when it ends)")


def _ms(label: str, seconds: float) -> Figure:
    return Figure(label, seconds * 1000, "ms")


def restarts(decision: Decision) -> int:
    return sum(type(e).tag() == "restart-process" for e in decision.effects)


async def appends(engine: Engine, count: int, start: int) -> list[float]:
    out = []
    for draft in tick_drafts(start, count, 100):
        t0 = time.perf_counter()
        await engine.append([draft])
        out.append(time.perf_counter() - t0)
    return out


async def run(args: argparse.Namespace) -> Report:
    report = Report(f"stall: the engine's loop while another process holds events.db's write "
                    f"lock for {args.hold:g} s")
    with temp_dir(args.tmp) as tmp:
        engine = Engine(tmp / "home", survival=config())
        await engine.open()
        try:
            await alive(engine)
            await engine.tick()
            before_appends = await appends(engine, args.appends, 0)
            before = await window(engine, args.hold / 2, args.ticks_every)
            decided_before, tick = await decide(engine, "w")
            restarts_before = restarts(await tick)
            await alive(engine)
            await engine.tick()
            db = Path(engine.events.recorder.location)
            holder = await asyncio.create_subprocess_exec(
                sys.executable, "-c", HOLDER, str(db), str(args.hold),
                stdout=asyncio.subprocess.PIPE)
            assert holder.stdout is not None
            line = await holder.stdout.readline()
            assert line.strip() == b"held", line
            held_at = time.perf_counter()
            during = await window(engine, args.hold / 2, args.ticks_every)
            decided_during, tick = await decide(engine, "v")
            await alive(engine)
            t0 = time.perf_counter()
            await engine.tick()  # waits behind the deciding tick, whose append waits
            next_tick = time.perf_counter() - t0
            decision = await tick
            stored_after = time.perf_counter() - held_at
            await holder.wait()
            after_appends = await appends(engine, args.appends, args.appends)
            disk = await stalled_disk(engine, args.hold, args.ticks_every)
            stored = [e for e in await engine.events.read(kinds=["effect"])
                      if e.data["effect"]["type"] == "restart-process"]
        finally:
            await engine.close()
        inline_lags = await lag_while_appending(tmp / "inline.db", args.appends * 5,
                                                INLINE_COMMIT)
        thread_lags = await lag_while_appending(tmp / "thread.db", args.appends * 5, 0.0)

    lag_max_before, lag_max = max(before.lags), max(during.lags)
    report.compare(_ms("loop lag p99 during the hold", percentile(during.lags, 99)),
                   _ms("loop lag p99 before it", percentile(before.lags, 99)))
    report.compare(_ms("longest loop stall during the hold", lag_max),
                   _ms("the hold", args.hold), floor=Floor.ratio_at_most(lag_max / args.hold,
                                                                        0.05))
    report.note(f"longest loop stall before the hold: {lag_max_before * 1000:.1f} ms")
    tick_p99, tick_p99_before = percentile(during.ticks, 99), percentile(before.ticks, 99)
    report.compare(_ms("quiet engine.tick() p50 during the hold", percentile(during.ticks, 50)),
                   _ms("quiet engine.tick() p50 before it", percentile(before.ticks, 50)))
    report.compare(_ms("quiet engine.tick() p99 during the hold", tick_p99),
                   _ms("quiet engine.tick() p99 before it", tick_p99_before),
                   floor=Floor.ratio_at_most(tick_p99 / tick_p99_before, 3.0))
    report.compare(_ms("survival decision (dead sample to restart decided) during the hold",
                      decided_during),
                   _ms("the same before it", decided_before))
    report.compare(_ms("single-draft append p50 after the hold", percentile(after_appends, 50)),
                   _ms("the same before it", percentile(before_appends, 50)))
    report.compare(_ms("the tick after the deciding one, during the hold", next_tick),
                   _ms("quiet engine.tick() p99 before the hold", tick_p99_before))
    report.note(f"{len(before.ticks)} quiet ticks before and {len(during.ticks)} during the "
                f"hold; restarts decided: {restarts_before} before the hold, "
                f"{restarts(decision)} during it (stored {stored_after:.2f} s after the hold "
                f"began, once the lock was let go); restart-process effects stored: "
                f"{len(stored)} (expected {2 if disk is None else 3})")
    report_disk_stall(report, disk, args.hold, before, decided_before)
    compare_lags(report, inline_lags, thread_lags)
    report.note("a tick that has something to record awaits its append: the ticks after it "
                "wait for the lock with it (the loop itself does not)")
    return report


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.stall", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hold", type=float, default=3.0,
                        help="seconds the other process holds the lock (default 3)")
    parser.add_argument("--ticks-every", type=float, default=10.0,
                        help="ms between quiet ticks (default 10)")
    parser.add_argument("--appends", type=int, default=200,
                        help="single-draft appends before and after the hold (default 200)")
    parser.add_argument("--tmp", default=None, help="base directory for the home")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
