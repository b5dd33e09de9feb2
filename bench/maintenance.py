"""One full maintenance cycle over a large memory, beside a plain UPDATE of the same rows.

    python -m bench.maintenance [--elements 100000] [--identities 1000] [--session 10]

A home on a temporary folder with `--elements` human exchanges spread over `--identities`
identities, arriving in sessions of `--session` exchanges in a row (appended through
`SqliteEventStore.append` in batches of 5,000, before the clock starts). Then one
`run_cycle` with the default decay (factor 0.97, floor 0.05, 10,000 elements per batch) and
budgets large enough for the whole memory, so every element is decayed once: assessment,
sleep tasks, skill verdicts, the sweep, contradiction, derivation and commitment reviews,
watch evaluation from seq 0, retention review and the report, all in the measurement.

Reports, each beside the limit it is judged against (no floors: context for the cycle's cost):
- the cycle's wall time vs a raw sqlite3 `UPDATE elements SET strength = max(floor,
  strength * factor), last_metabolized_at = ?` of the same number of rows in one
  transaction (a table created with that count, WAL, synchronous=FULL);
- the events the cycle appended vs the elements it decayed (one `memory-metabolized` per
  identity per batch carries many records);
- the appends (transactions) it made vs the batches the sweep needs (elements / limit).
Notes give the whole-log fold the checkpoint saves, and each cycle's CPU time beside its
wall time (on a machine shared with other work the wall time also holds their share).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import Figure, Floor, Report, temp_dir
from pulse_adapters.maintenance import Budgets, CycleReport, MaintenanceSettings, run_cycle
from pulse_core import EventDraft, ManualClock, SqliteEventStore, identity_key
from pulse_core.maintenance import ElementsReader

START_MS = 1_700_000_000_000
FLOOR_RATIO = 10.0
BATCH = 5_000


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.maintenance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=100_000)
    parser.add_argument("--identities", type=int, default=1_000)
    parser.add_argument("--session", type=int, default=10,
                        help="exchanges in a row from one identity")
    parser.add_argument("--tmp", default=None, help="where the temporary home goes")
    return parser.parse_args(argv)


def drafts(elements: int, identities: int, session: int) -> list[EventDraft]:
    out: list[EventDraft] = []
    for n in range(elements):
        who = (n // session) % identities
        out.append(EventDraft("human-exchange", identity_key(f"p{who:05d}"),
                              {"record": f"x-{n}", "text": f"message {n}", "role": "human"},
                              origin="human"))
    return out


async def build(path: Path, clock: ManualClock, args: argparse.Namespace) -> SqliteEventStore:
    store = await SqliteEventStore.open(path, clock=clock)
    todo = drafts(args.elements, args.identities, args.session)
    for at in range(0, len(todo), BATCH):
        await store.append(todo[at:at + BATCH])
    return store


def raw_update(path: Path, rows: int, factor: float, floor: float) -> float:
    """Seconds for one UPDATE of `rows` rows' strength and stamp, in one transaction."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE elements (id TEXT PRIMARY KEY, strength REAL NOT NULL, "
                     "last_metabolized_at INTEGER)")
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO elements VALUES (?, 1.0, NULL)",
                         ((f"p{n % 1000:05d}/x-{n}",) for n in range(rows)))
        conn.execute("COMMIT")
        started = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        changed = conn.execute(
            "UPDATE elements SET strength = max(?, round(strength * ?, 6)), "
            "last_metabolized_at = ? WHERE strength > ? AND (last_metabolized_at IS NULL OR "
            "last_metabolized_at < ?)", (floor, factor, START_MS, floor, START_MS)).rowcount
        conn.execute("COMMIT")
        elapsed = time.perf_counter() - started
        assert changed == rows, (changed, rows)
    finally:
        conn.close()
    return elapsed


async def timed_cycle(store: SqliteEventStore, settings: MaintenanceSettings,
                      clock: ManualClock, name: str, reader: ElementsReader
                      ) -> tuple[float, float, CycleReport, int]:
    """One cycle `decay.min_interval_h` and an hour after the last (every element is due
    again): seconds, CPU seconds (this process, every thread), its report and the events it
    appended."""
    clock.advance(int((settings.decay.min_interval_h + 1) * 3_600_000))
    before = await store.last_seq()
    started, cpu = time.perf_counter(), time.process_time()
    cycle = await run_cycle(store, settings, clock=clock, cycle=name, reader=reader)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    return elapsed, cpu, cycle, await store.last_seq() - before


async def run(args: argparse.Namespace) -> Report:
    report = Report(f"maintenance: one full cycle over {args.elements:,} elements "
                    f"({args.identities:,} identities, sessions of {args.session})")
    settings = MaintenanceSettings(budgets=Budgets(
        max_elements_reviewed=max(5_000, 2 * args.elements),
        max_writes=max(500, 2 * args.elements), max_transactions=100_000))
    with temp_dir(args.tmp) as tmp:
        clock = ManualClock(START_MS)
        store = await build(tmp / "events.db", clock, args)
        ckpt = tmp / "checkpoints" / "maintenance"
        # An engine's first cycle ever: no checkpoint yet, the whole log is folded (then saved).
        cold_s, _, cold, _ = await timed_cycle(store, settings, clock, "bench-cold",
                                               ElementsReader(store, checkpoints=ckpt))
        # The engine restarts: a new reader resumes from the checkpoint, folds only the tail.
        restarted = ElementsReader(store, checkpoints=ckpt)
        resumed_from = restarted.cursor
        ckpt_bytes = (ckpt / "elements.ckpt").stat().st_size
        start_s, start_cpu, start, appended = await timed_cycle(
            store, settings, clock, "bench-restart", restarted)
        # The steady state: the executor's kept reader, next cycle.
        kept_s, kept_cpu, kept, _ = await timed_cycle(store, settings, clock, "bench-kept",
                                                      restarted)
        started = time.perf_counter()
        await ElementsReader(store).current()  # the whole-log fold a checkpoint saves
        fold_s = time.perf_counter() - started
        await store.close()
        raw = raw_update(tmp / "raw.db", args.elements, settings.decay.factor,
                         settings.decay.floor)
    limit = Figure(f"raw sqlite3 UPDATE of {args.elements:,} rows' strength", raw, "s")
    for what, cycle in (("first", cold), ("after a restart", start), ("kept reader", kept)):
        decayed = cycle.changes.get("decayed", 0)
        if decayed != args.elements or cycle.warnings:
            report.note(f"WARNING: cycle ({what}) decayed {decayed:,} of {args.elements:,} "
                        f"elements; warnings {list(cycle.warnings) or 'none'}")
    ratio = start_s / raw
    report.compare(Figure(f"first cycle after a restart over {args.elements:,} elements "
                          "(reader from its checkpoint)", start_s, "s"), limit, ratio=ratio,
                   floor=Floor.ratio_at_most(ratio, FLOOR_RATIO))
    ratio = kept_s / raw
    report.compare(Figure(f"next cycle, kept reader, over {args.elements:,} elements",
                          kept_s, "s"), limit, ratio=ratio,
                   floor=Floor.ratio_at_most(ratio, FLOOR_RATIO))
    report.compare(Figure(f"first cycle ever (no checkpoint: whole-log fold) over "
                          f"{args.elements:,} elements", cold_s, "s"), limit)
    report.compare(Figure("events appended by a cycle", appended, "events"),
                   Figure("elements decayed", start.changes.get("decayed", 0), "elements"))
    batches = math.ceil(args.elements / settings.decay.limit)
    report.compare(Figure("appends made by a cycle", start.transactions, "appends"),
                   Figure(f"sweep batches of {settings.decay.limit}", batches, "batches"))
    report.note(f"the restarted reader resumed from its checkpoint at seq {resumed_from:,}; "
                f"a whole-log fold without it takes about {fold_s:.2f} s (measured after); "
                f"the checkpoint is {ckpt_bytes / 1e6:.1f} MB "
                f"({ckpt_bytes / max(args.elements, 1):.0f} bytes an element)")
    report.note(f"CPU time (this process, every thread) of the cycle after a restart "
                f"{start_cpu:.3f} s, kept reader {kept_cpu:.3f} s: "
                "wall time above it is waiting (disk, other processes)")
    report.note(f"cycle after a restart {start.status}: {start.outcome}; changes "
                f"{start.changes}")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
