"""What keeping tick records costs: a tick that writes, with its record and without.

    python -m bench.tick_records [--ticks 300] [--keys 4] [--rounds 3]

Two engines on two homes, alike but for `engine.ticker.records`. Before each tick every one
of `--keys` vitals keys gets a new sample and one event is appended; the one rule reads every
key and emits one Mark, so every tick writes (a tick that writes nothing keeps nothing and
costs nothing more). Only `engine.tick()` is timed. The two engines take turns in `--rounds`
blocks, so drift in the machine falls on both.

Reports the median and p99 tick with records beside the same without; what a record adds to
a writing tick's median beside a raw durable write of the same bytes (write, fsync, rename,
directory fsync: what any durable file costs; floor: added <= 2x raw); the bytes of a record
beside the bytes of the events the same tick writes anyway; and the object store's write of
a record beside the raw durable write.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from bench.common import Figure, Floor, Report, fmt, median, percentile, temp_dir
from pulse_core import (
    Decision,
    Engine,
    EventDraft,
    Inner,
    Mark,
    ObjectStore,
    Snapshot,
    open_home,
    register_kind,
)

FLOOR_RATIO = 2.0


class Seen(Mark, tag="bench-seen"):
    """What the rule saw this tick."""

    total: int


async def sum_vitals(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    """Read every key, emit one mark."""
    effects, tick_ms = await inner(prev, curr)
    total = sum(int(r.sample.data["v"]) for r in curr.vitals.values())
    return Decision([*effects, Seen(total=total)], tick_ms)


async def _ticks(engine: Engine, count: int, keys: int, start: int) -> list[float]:
    timed: list[float] = []
    for n in range(start, start + count):
        for k in range(keys):
            await engine.vitals.record(f"key-{k}", {"v": n + k, "note": f"reading {n}"})
        await engine.append([EventDraft("bench-event", f"e-{n % 10}", {"n": n})])
        started = time.perf_counter()
        await engine.tick()
        timed.append(time.perf_counter() - started)
    return timed


def _raw_write(folder: Path, data: bytes, n: int) -> float:
    """A raw write + fsync + rename + directory fsync of `data` (what a durable file costs)."""
    tmp, target = folder / f".tmp-{n}", folder / f"raw-{n}"
    started = time.perf_counter()
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, target)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - started


async def _sizes(home: Path) -> tuple[list[int], list[int]]:
    """(bytes of each record, bytes of the events written with it) over `home`'s ticks."""
    stores = await open_home(home, read_only=True)
    try:
        records: list[int] = []
        events: list[int] = []
        for tick in await stores.events.read(kinds=["tick"]):
            if tick.hash is None:
                continue
            records.append(len(await stores.objects.get(tick.hash)))
            written = await stores.events.read(tick.seq - 2, limit=2)
            events.append(sum(len(msgspec.json.encode(e)) for e in written))
        return records, events
    finally:
        await stores.close()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.tick_records", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ticks", type=int, default=300, help="timed ticks per engine (300)")
    parser.add_argument("--keys", type=int, default=4, help="vitals keys sampled per tick (4)")
    parser.add_argument("--rounds", type=int, default=3, help="turns each engine takes (3)")
    parser.add_argument("--tmp", default=None, help="base directory for the homes")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> Report:
    register_kind("bench-event", "an event the bench appends before each tick")
    report = Report(f"tick_records: a tick that writes, with and without its record "
                    f"({args.keys} vitals keys, median of {args.ticks} ticks each)")
    with temp_dir(args.tmp) as tmp:
        engines = {}
        for records in (True, False):
            engine = Engine(tmp / f"records-{records}", rules=[sum_vitals])
            engine.ticker.records = records
            await engine.open()
            engines[records] = engine
        timed: dict[bool, list[float]] = {True: [], False: []}
        per_round = max(1, args.ticks // args.rounds)
        try:
            for r in range(args.rounds):
                for records, engine in engines.items():
                    timed[records] += await _ticks(engine, per_round, args.keys, r * per_round)
        finally:
            for engine in engines.values():
                await engine.close()
        records_b, events_b = await _sizes(tmp / "records-True")
        raw_folder = tmp / "raw"
        raw_folder.mkdir()
        sample = await _record_bytes(tmp / "records-True")
        objects = ObjectStore(tmp / "objects-bench")
        puts, raws = [], []
        for n in range(min(args.ticks, 200)):
            data = sample + str(n).encode()
            started = time.perf_counter()
            objects.put_sync(data)
            puts.append(time.perf_counter() - started)
            raws.append(_raw_write(raw_folder, data, n))

    with_p50, without_p50 = median(timed[True]) * 1000, median(timed[False]) * 1000
    raw_p50 = median(raws) * 1000
    report.compare(Figure("tick p50 with records", with_p50, "ms"),
                   Figure("tick p50 without records", without_p50, "ms"))
    added = max(with_p50 - without_p50, 0.0)  # a quiet run may time it below zero
    report.compare(Figure("added per writing tick p50", added, "ms"),
                   Figure("raw durable file write p50", raw_p50, "ms"),
                   floor=Floor.ratio_at_most(added / raw_p50, FLOOR_RATIO))
    report.compare(Figure("tick p99 with records", percentile(timed[True], 99) * 1000, "ms"),
                   Figure("tick p99 without records", percentile(timed[False], 99) * 1000,
                          "ms"))
    report.compare(Figure("bytes per tick record (mean)", sum(records_b) / len(records_b), "B"),
                   Figure("bytes of that tick's events (mark + tick)",
                          sum(events_b) / len(events_b), "B"))
    report.compare(Figure("ObjectStore.put_sync of a record p50", median(puts) * 1000, "ms"),
                   Figure("raw durable file write p50", raw_p50, "ms"))
    report.note(f"records: min {fmt(min(records_b))} B, max {fmt(max(records_b))} B over "
                f"{len(records_b)} ticks; {args.keys} keys of one sample each")
    return report


async def _record_bytes(home: Path) -> bytes:
    stores = await open_home(home, read_only=True)
    try:
        (tick,) = await stores.events.read(kinds=["tick"], newest_first=True, limit=1)
        assert tick.hash is not None
        return await stores.objects.get(tick.hash)
    finally:
        await stores.close()


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
