"""A tick's work against the PostgreSQL log with a small and a large history: it must touch
only what is new.

    python -m bench.pg_scale [--small 10000] [--large 10000000] [--ticks 200] [--url ...]

For each size, a log in a schema of its own (created by the recorder itself, so with pulse's
own tables, indexes and triggers) is filled in SQL with generate_series: blocks of 20 events,
an effect's lifecycle (effect, effect-executing, effect-acked) and 17 `tick` events over 1000
keys, seq gap-free and every key's versions and head consistent; then VACUUM ANALYZE, as
autovacuum would have left a long-lived table. Then, `--ticks` times (after `--warmup`), what
arrives between two ticks is appended (5 tick events and one new effect), untimed, and what a
tick and its executor loop then do against the store is timed:

- the executor index's read: `pages(cursor, kinds=<effect kinds>)` after its cursor;
- the projector's read: `read_page(cursor)` of every new event;
- version lookups: `head()` of the new effect and of a key from the history;
- the claim: an `effect-executing` append expecting the effect's version (one commit).

The two sizes take turns tick by tick, so passing load on the machine falls on both alike.
Reports the median at both sizes and their ratio (floor: large <= 2x small), each size beside
a raw `SELECT <columns> FROM events WHERE seq > $1 ORDER BY seq` of the same new rows and a
raw 1-row INSERT + COMMIT on the same table (psycopg, the recorder's driver), and the median
of each part. Without `--url` a server is started here (tests/servers.py, fsync on).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import psycopg

from bench.common import Figure, Floor, Report, fmt, median, on_postgres
from pulse_core._effects import EFFECT_KINDS
from pulse_core._events import EventDraft
from pulse_core.store import EventStore, open_event_store
from pulse_core.store._pg_ddl import COLUMNS, quoted

FLOOR_RATIO = 2.0
FILL_CHUNK = 1_000_000
KEYS = 1_000
PARTS = ("index read", "projector read", "version lookups", "claim append")

# One row of the history per g (1-based seq): block b = (g-1)/20, position p = (g-1)%20.
# p 0..2: effect b's lifecycle (versions 1..3); p 3..19: tick t = 17b + p - 3 on key t%1000.
FILL = """
INSERT INTO {s}.events ({columns})
SELECT g, 'h-' || g,
       CASE p WHEN 0 THEN 'effect' WHEN 1 THEN 'effect-executing' WHEN 2 THEN 'effect-acked'
              ELSE 'tick' END,
       CASE WHEN p < 3 THEN 'bench-effect-' || b
            ELSE 'subject-' || lpad((t %% {keys})::text, 5, '0') END,
       CASE WHEN p < 3 THEN p + 1 ELSE t / {keys} + 1 END,
       1700000000000 + g, CASE WHEN p < 3 THEN 'engine:tick' ELSE 'engine' END, NULL,
       'tx-' || (g / 4096), NULL,
       convert_to(CASE p
           WHEN 0 THEN '{{"effect":{{"type":"bench-noop"}},"dedup":"bench-effect-' || b || '"}}'
           WHEN 1 THEN '{{"attempt":1,"lease_until":0,"owner":"bench"}}'
           WHEN 2 THEN '{{"attempt":1,"result":null,"duration_ms":1}}'
           ELSE '{{"n":' || t || ',"load":0.42,"note":"bench"}}' END, 'UTF8'),
       NULL
FROM (SELECT g, (g - 1) / 20 AS b, (g - 1) %% 20 AS p, ((g - 1) / 20) * 17 + (g - 1) %% 20 - 3 AS t
      FROM generate_series(%s::bigint, %s::bigint) g) rows
"""


def schema_url(url: str, schema: str) -> str:
    """`url` naming the log in `schema`."""
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


async def build(url: str, schema: str, size: int) -> float:
    """A log of `size` events in `schema` (the recorder creates the tables); seconds taken."""
    store = await open_event_store(schema_url(url, schema))
    await store.close()
    s = quoted(schema)
    started = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for lo in range(1, size + 1, FILL_CHUNK):
            hi = min(size, lo + FILL_CHUNK - 1)
            await conn.execute(FILL.format(s=s, columns=COLUMNS, keys=KEYS), (lo, hi))
        await conn.execute(f"VACUUM ANALYZE {s}.events")
    return time.perf_counter() - started


class History:
    """One history size: its log, the cursors a tick keeps on it, what was measured there
    (seconds per tick, per part, per raw statement)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.schema = f"scale_{size}"
        self.build_s = 0.0
        self.store: EventStore | None = None
        self.cursor = [0, 0]  # the executor index's and the projector's
        self.ticks: list[float] = []
        self.parts: dict[str, list[float]] = {part: [] for part in PARTS}
        self.select: list[float] = []
        self.insert: list[float] = []

    def ms(self, values: list[float]) -> float:
        return median(values) * 1000

    async def open(self, url: str) -> None:
        """Build the log and open it; the cursors start at its end."""
        self.build_s = await build(url, self.schema, self.size)
        self.store = await open_event_store(schema_url(url, self.schema))
        top = await self.store.last_seq()
        if top != self.size:
            raise RuntimeError(f"built {top} events, expected {self.size}")
        self.cursor = [top, top]

    async def tick(self, number: int, measured: bool) -> None:
        """Append what arrives between two ticks (untimed), then time one tick's store work
        (see the module docstring), each part on its own."""
        assert self.store is not None
        store, cursor = self.store, self.cursor
        drafts, effect = arrivals(number)
        await store.append(drafts)
        marks = [time.perf_counter()]
        async for page in store.pages(cursor[0], kinds=EFFECT_KINDS, limit=5_000):
            cursor[0] = page.last_seq if len(page.events) < 5_000 else page.events[-1].seq
        marks.append(time.perf_counter())
        page = await store.read_page(cursor[1], limit=5_000)
        cursor[1] = page.last_seq
        marks.append(time.perf_counter())
        version = await store.head(effect)
        await store.head(f"subject-{number % KEYS:05d}")
        marks.append(time.perf_counter())
        await store.append([EventDraft("effect-executing", effect,
                                       {"attempt": 1, "lease_until": 0, "owner": "bench"},
                                       origin="executor:bench")], expect={effect: version})
        marks.append(time.perf_counter())
        if measured:
            self.ticks.append(marks[-1] - marks[0])
            for part, began, ended in zip(PARTS, marks[:-1], marks[1:], strict=True):
                self.parts[part].append(ended - began)

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()


def arrivals(tick: int) -> tuple[list[EventDraft], str]:
    """What arrives between two ticks: 5 tick events and one new effect (its key)."""
    effect = f"live-effect-{tick:06d}"
    drafts = [EventDraft("tick", f"live-{i % 10}", {"n": i, "load": 0.42}, origin="engine")
              for i in range(tick * 5, tick * 5 + 5)]
    drafts.append(EventDraft("effect", effect, {"effect": {"type": "bench-noop"},
                                                "dedup": effect}, origin="engine:tick"))
    return drafts, effect


async def raw_limits(url: str, histories: Sequence[History], rows: int, repeats: int
                     ) -> None:
    """Raw psycopg on each history's table, taking turns: SELECT of the newest `rows` rows
    after a seq, and a 1-row INSERT + COMMIT (rows past the log's end, read by nothing)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        last = {}
        for history in histories:
            cur = await conn.execute(
                f"SELECT coalesce(max(seq), 0) FROM {quoted(history.schema)}.events")
            row = await cur.fetchone()
            last[history.size] = int(str(row[0])) if row else 0
        for n in range(1, repeats + 1):
            for history in histories if n % 2 else reversed(histories):
                s, top = quoted(history.schema), last[history.size]
                started = time.perf_counter()
                await (await conn.execute(f"SELECT {COLUMNS} FROM {s}.events WHERE seq > %s "
                                          "ORDER BY seq", (top - rows,))).fetchall()
                history.select.append(time.perf_counter() - started)
                started = time.perf_counter()
                async with conn.transaction():
                    await conn.execute(
                        f"INSERT INTO {s}.events ({COLUMNS}) VALUES (%s, %s, 'tick', 'raw', %s,"
                        " 0, 'bench', NULL, 'raw', NULL, %s, NULL)",
                        (top + n, f"raw-{n}", n, b'{"n":1}'))
                history.insert.append(time.perf_counter() - started)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=10_000, help="small history (10,000)")
    parser.add_argument("--large", type=int, default=10_000_000,
                        help="large history (10,000,000)")
    parser.add_argument("--ticks", type=int, default=200, help="measured ticks per size")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured ticks first")
    parser.add_argument("--url", default=None,
                        help="a database to build the logs in (default: start a server)")
    return parser.parse_args(argv)


async def run(url: str, args: argparse.Namespace) -> Report:
    report = Report(f"pg_scale: a tick's store work with {args.small:,} vs {args.large:,} "
                    "events of history (PostgreSQL, psycopg)")
    small, large = History(args.small), History(args.large)
    try:
        for history in (small, large):
            await history.open(url)
        # Taking turns, so both sizes meet the same machine (other load comes and goes).
        for number in range(args.warmup + args.ticks):
            for history in (small, large) if number % 2 else (large, small):
                await history.tick(number, measured=number >= args.warmup)
    finally:
        await small.close()
        await large.close()
    await raw_limits(url, (small, large), rows=7, repeats=args.ticks)
    ratio = large.ms(large.ticks) / small.ms(small.ticks)
    report.compare(Figure(f"tick at {large.size:,} events", large.ms(large.ticks), "ms"),
                   Figure(f"tick at {small.size:,} events", small.ms(small.ticks), "ms"),
                   floor=Floor.ratio_at_most(ratio, FLOOR_RATIO))
    for history in (small, large):
        tick = Figure(f"tick at {history.size:,} events", history.ms(history.ticks), "ms")
        report.compare(tick, Figure(f"raw SELECT of the 7 newest rows at {history.size:,}",
                                    history.ms(history.select), "ms"))
        report.compare(tick, Figure(f"raw 1-row INSERT + COMMIT at {history.size:,}",
                                    history.ms(history.insert), "ms"))
    for history in (small, large):
        parts = ", ".join(f"{part} {fmt(history.ms(times))} ms"
                          for part, times in history.parts.items())
        report.note(f"{history.size:,} events (built in {fmt(history.build_s)} s): {parts}")
    report.note(f"medians of {args.ticks} ticks per size after {args.warmup} warm-up ticks, "
                "the sizes taking turns; 6 new events arrive before each tick")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    return on_postgres(args.url, lambda url: run(url, args))


if __name__ == "__main__":
    raise SystemExit(main())
