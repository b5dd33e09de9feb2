"""One recall over many elements, beside the raw FTS5 query of the same rows.

    python -m bench.recall [--elements 100000] [--identities 2000] [--repeat 3] [--steady 50]

`--elements` human exchanges over `--identities` identities are appended through a home-like
store (SQLite, synchronous=FULL, WAL, element keys in keys.db: every text sealed and put into
the keys' FTS5 index). A rare word is in 10 of them, a common word in every one. Then
`pulse_core.memory.recall(store, RecallQuery(text=..., limit=10))` is timed (median of
`--repeat` calls; each call folds the memory and the elements from the log, as documented)
beside the raw sqlite3 FTS5 query that finds the same rows in keys.db
(`SELECT element FROM element_text WHERE element_text MATCH ?`), in the same run.

Each word is recalled through a warm `Recaller` (its fold kept: what a server or the Hermes
offer would keep) and one-shot (`recall()`, folding the whole log each call). Floor: the warm
recall of the rare word <= 3 x the raw FTS5 query (the issue's goal); the rest is context,
among it the same two measured `--steady` times each (medians), once both are warm.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import Figure, Floor, Report, temp_dir
from pulse_core.memory import Recaller, RecallQuery, exchange_draft, recall
from pulse_core.store import ElementKeys, EventStore, SqliteEventStore

RARE, COMMON = "quetzalcoatl", "weather"


async def fill(path: Path, elements: int, identities: int) -> EventStore:
    """A store with `elements` sealed, indexed exchanges; RARE in 10 of them."""
    store = await SqliteEventStore.open(path / "events.db", synchronous="FULL")
    store.keys = ElementKeys(path / "keys.db")
    rare_every = max(elements // 10, 1)
    batch = []
    for i in range(elements):
        extra = f" {RARE}" if i % rare_every == 0 else ""
        batch.append(exchange_draft(f"id-{i % identities}",
                                    f"note {i} about the {COMMON} by the sea{extra}",
                                    record=f"x-{i}"))
        if len(batch) == 500:
            await store.append(batch)
            batch = []
    if batch:
        await store.append(batch)
    return store


def raw_fts(path: Path, word: str, repeat: int) -> tuple[float, int]:
    """Median ms of the raw FTS5 query for `word` on keys.db, and the rows it finds."""
    db = sqlite3.connect(path / "keys.db")
    try:
        times, rows = [], 0
        for _ in range(repeat):
            started = time.perf_counter()
            rows = len(db.execute("SELECT element FROM element_text WHERE element_text "
                                  "MATCH ?", (f'"{word}"*',)).fetchall())
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times), rows
    finally:
        db.close()


async def timed_recall(store: EventStore, word: str, repeat: int, *, warm: Recaller | None
                       ) -> tuple[float, int]:
    """Median ms of a recall(text=word, limit=10): one-shot (folding the log) or through a
    `warm` Recaller; and how many it returned."""
    times, found = [], 0
    query = RecallQuery(text=word, limit=10)
    for _ in range(repeat):
        started = time.perf_counter()
        found = len(await (warm.recall(query) if warm else recall(store, query)))
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), found


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.recall", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=100_000, help="exchanges written")
    parser.add_argument("--identities", type=int, default=2_000,
                        help="identities (memory keeps 50 exchanges each: 2,000 x 50 keeps "
                             "all 100,000 recallable)")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls of each query")
    parser.add_argument("--steady", type=int, default=50,
                        help="calls of the warm rare-word recall and of its raw query for "
                             "the steady-state line (context)")
    parser.add_argument("--tmp", default=None, help="base directory for the databases")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> Report:
    report = Report(f"recall: {args.elements:,} sealed exchanges of {args.identities:,} "
                    f"identities, text recall (limit 10) beside raw FTS5 in keys.db")
    with temp_dir(args.tmp) as path:
        started = time.perf_counter()
        store = await fill(path, args.elements, args.identities)
        filled = time.perf_counter() - started
        try:
            warm = Recaller(store)
            await warm.recall(RecallQuery(text=RARE, limit=1))  # folds the log once
            for word, what in ((RARE, "rare"), (COMMON, "common")):
                raw_ms, rows = raw_fts(path, word, args.repeat)
                for recaller, how in ((warm, "warm Recaller"), (None, "one-shot recall()")):
                    ms, found = await timed_recall(store, word, args.repeat, warm=recaller)
                    ratio = ms / raw_ms if raw_ms > 0 else float("inf")
                    floor = (Floor.ratio_at_most(ratio, 3.0)
                             if what == "rare" and recaller is not None else None)
                    report.compare(
                        Figure(f"{how} {what} word ({found} returned)", ms, "ms"),
                        Figure(f"raw FTS5 MATCH ({rows} rows)", raw_ms, "ms"),
                        floor=floor, ratio=ratio)
            raw_ms, rows = raw_fts(path, RARE, args.steady)
            ms, found = await timed_recall(store, RARE, args.steady, warm=warm)
            report.compare(
                Figure(f"warm Recaller rare word, {args.steady} calls ({found} returned)",
                       ms, "ms"),
                Figure(f"raw FTS5 MATCH, {args.steady} runs ({rows} rows)", raw_ms, "ms"),
                floor=None, ratio=ms / raw_ms if raw_ms > 0 else float("inf"))
        finally:
            await store.close()
    report.note(f"filled in {filled:.1f} s; ratio = recall / raw (lower is better); each "
                "one-shot recall folds the memory and the elements from the whole log")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
