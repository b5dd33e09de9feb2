"""What every benchmark shares: the machine's limits, measured in the same run, and the report.

A figure alone says little on an unknown machine, so each benchmark prints it beside a limit
taken here (raw sqlite3, a bare asyncio wake-up, an idle interpreter) and the ratio of the two:

    append 32 appenders x 100 drafts: 61,200 ev/s | raw sqlite3 ...: 97,000 rows/s | ratio 0.63
    (floor >= 0.50) PASS
"""

from __future__ import annotations

import asyncio
import math
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import psutil

from pulse_core._effects import Effect, ExecutionContext, Executor
from pulse_core._events import EventDraft, encode_data, uuid7
from pulse_core._executor_loop import ExecutorLoop
from pulse_core.store import open_event_store
from pulse_core.store._sqlite_recorder import SCHEMA

if TYPE_CHECKING:
    from tests.servers import PostgresServer

REPO = Path(__file__).resolve().parents[1]

# The events table's columns, in the order the store writes them.
COLUMNS = "seq, id, kind, key, version, ts, origin, cause, tx, idem, data, hash"
INSERT = f"INSERT INTO events ({COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
Row = tuple[int, str, str, str, int, int, str, "int | None", str, "str | None", bytes,
            "str | None"]


# -- report ---------------------------------------------------------------------------------


def fmt(value: float) -> str:
    """A number for humans: thousands separators for big values, 3 significant digits for small."""
    if math.isinf(value) or math.isnan(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    if magnitude >= 0.01:
        return f"{value:.3f}"
    return f"{value:.4f}"


@dataclass(frozen=True)
class Figure:
    """One measured number with its label and unit."""

    label: str
    value: float
    unit: str

    def text(self) -> str:
        return f"{self.label}: {fmt(self.value)} {self.unit}"


@dataclass(frozen=True)
class Floor:
    """The bar a figure must clear, as printed, and whether it did."""

    text: str
    passed: bool

    @classmethod
    def ratio_at_least(cls, ratio: float, minimum: float) -> Floor:
        return cls(f"floor >= {minimum:.2f}", ratio >= minimum)

    @classmethod
    def ratio_at_most(cls, ratio: float, maximum: float) -> Floor:
        return cls(f"floor <= {maximum:.2f}", ratio <= maximum)

    @classmethod
    def below(cls, figure: Figure, maximum: float, what: str = "") -> Floor:
        name = what or figure.label.rsplit(" ", 1)[-1]
        return cls(f"floor {name} < {fmt(maximum)} {figure.unit}", figure.value < maximum)


def ratio_of(figure: Figure, limit: Figure) -> float:
    """figure / limit, inf when the limit is zero (below the clock's resolution)."""
    if limit.value == 0:
        return math.inf if figure.value > 0 else 1.0
    return figure.value / limit.value


class Report:
    """Prints one line per comparison and remembers whether every floor passed."""

    def __init__(self, title: str, out: TextIO | None = None) -> None:
        self.out = out
        self.lines: list[str] = []
        self.floors: list[Floor] = []
        self._print(f"== {title} ==")

    def _print(self, text: str) -> None:
        self.lines.append(text)
        print(text, file=self.out or sys.stdout, flush=True)

    def compare(
        self,
        figure: Figure,
        limit: Figure,
        *,
        floor: Floor | None = None,
        ratio: float | None = None,
    ) -> str:
        """`figure | limit | ratio r (floor) PASS/FAIL`; the ratio defaults to figure/limit."""
        r = ratio_of(figure, limit) if ratio is None else ratio
        ratio_text = "inf" if math.isinf(r) else f"{r:.2f}" if r >= 0.01 else f"{r:.4f}"
        text = f"{figure.text()} | {limit.text()} | ratio {ratio_text}"
        if floor is None:
            text += " (no floor)"
        else:
            self.floors.append(floor)
            text += f" ({floor.text}) {'PASS' if floor.passed else 'FAIL'}"
        self._print(text)
        return text

    def note(self, text: str) -> None:
        self._print(f"  {text}")

    @property
    def passed(self) -> bool:
        return all(f.passed for f in self.floors)

    def exit_code(self) -> int:
        return 0 if self.passed else 1


# -- shared workload ------------------------------------------------------------------------


def key_of(i: int, keys: int) -> str:
    """The i-th event's key: `keys` distinct keys, interleaved as real traffic is."""
    return f"subject-{i % keys:05d}"


def tick_payload(i: int) -> dict[str, Any]:
    return {"n": i, "load": 0.42, "note": "bench"}


def tick_drafts(start: int, count: int, keys: int) -> list[EventDraft]:
    """`count` small `tick` drafts over `keys` interleaved keys."""
    return [EventDraft("tick", key_of(i, keys), tick_payload(i), origin="engine")
            for i in range(start, start + count)]


def event_rows(count: int, keys: int, start_seq: int = 1) -> list[Row]:
    """Rows like the store writes for `tick_drafts`: ids, per-key versions, one tx per row."""
    now = time.time_ns() // 1_000_000
    tx = uuid7()
    rows: list[Row] = []
    for n in range(count):
        i = start_seq - 1 + n
        version = i // keys + 1
        rows.append((start_seq + n, uuid7(), "tick", key_of(i, keys), version, now, "engine",
                     None, tx, None, encode_data(tick_payload(i)), None))
    return rows


@contextmanager
def temp_dir(base: str | None = None) -> Iterator[Path]:
    """A fresh directory on local disk (under `base`, or the system temp dir), removed after."""
    with tempfile.TemporaryDirectory(prefix="pulse-bench-", dir=base) as name:
        yield Path(name)


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) by nearest rank."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


# -- limits: raw sqlite3 --------------------------------------------------------------------


def raw_connection(path: Path, synchronous: str = "FULL", *,
                   any_thread: bool = False) -> sqlite3.Connection:
    """A plain sqlite3 connection in WAL mode with the events table (same columns, indexes);
    `any_thread`: usable from threads other than its creator's."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=not any_thread)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.executescript(SCHEMA)
    return conn


def raw_insert_rate(path: Path, rows: Sequence[Row], per_commit: int,
                    synchronous: str = "FULL") -> float:
    """Rows/s of plain sqlite3 executemany, `per_commit` rows per transaction, one thread.

    The rows are built before the clock starts: this is what SQLite and the disk allow.
    """
    conn = raw_connection(path, synchronous)
    try:
        started = time.perf_counter()
        for at in range(0, len(rows), per_commit):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(INSERT, rows[at:at + per_commit])
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
    return len(rows) / elapsed


def raw_commit_latencies(path: Path, count: int, synchronous: str = "FULL") -> list[float]:
    """Seconds per single-row durable commit (BEGIN, INSERT, COMMIT) with plain sqlite3."""
    rows = event_rows(count, 1000)
    conn = raw_connection(path, synchronous)
    out: list[float] = []
    try:
        for row in rows:
            started = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(INSERT, row)
            conn.execute("COMMIT")
            out.append(time.perf_counter() - started)
    finally:
        conn.close()
    return out


def raw_select_after(path: Path, after_seq: int, repeats: int) -> tuple[list[float], int]:
    """Seconds per `SELECT <columns> FROM events WHERE seq > ?` on its own connection, and rows."""
    conn = sqlite3.connect(path, isolation_level=None)
    out: list[float] = []
    found = 0
    try:
        conn.execute(f"SELECT {COLUMNS} FROM events WHERE seq > ?", (after_seq,)).fetchall()
        for _ in range(repeats):
            started = time.perf_counter()
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM events WHERE seq > ? ORDER BY seq", (after_seq,)
            ).fetchall()
            out.append(time.perf_counter() - started)
            found = len(rows)
    finally:
        conn.close()
    return out, found


# -- limits: asyncio ------------------------------------------------------------------------


async def asyncio_wake_latencies(count: int) -> list[float]:
    """Seconds from `event.set()` in one task to the waiting task running, `count` times."""
    go = asyncio.Event()
    back = asyncio.Event()
    sent = [0.0]
    out: list[float] = []

    async def waiter() -> None:
        for _ in range(count):
            await go.wait()
            out.append(time.perf_counter() - sent[0])
            go.clear()
            back.set()

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    for _ in range(count):
        back.clear()
        sent[0] = time.perf_counter()
        go.set()
        await back.wait()
    await task
    return out


# -- limits: processes ----------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """A process's CPU time over a wall-clock window, and its resident memory at the end."""

    cpu_seconds: float
    wall_seconds: float
    rss_bytes: int
    said: str = ""
    """What the child printed after `ready` on its ready line."""

    @property
    def cpu_percent(self) -> float:
        """Percent of one core."""
        return 100.0 * self.cpu_seconds / self.wall_seconds

    @property
    def rss_mib(self) -> float:
        return self.rss_bytes / (1024 * 1024)


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def measure_children(commands: Sequence[Sequence[str]], seconds: float, *,
                     settle: float = 0.0, ready_timeout: float = 120.0) -> list[Usage]:
    """Start every command at once, wait for each to print a line starting `ready`, let them
    settle `settle` seconds, then measure them all over the same `seconds`-long window with
    psutil (CPU time delta / wall time, RSS at the end).

    Each child must stay up for `settle + seconds` after printing `ready`, then exit by itself.
    """
    with tempfile.TemporaryFile("w+") as errors_file:
        procs = [subprocess.Popen(list(cmd), cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=errors_file, text=True) for cmd in commands]
        try:
            deadline = time.monotonic() + ready_timeout
            said: list[str] = []
            for proc in procs:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                said.append(line.strip().removeprefix("ready").strip())
                if not line.startswith("ready") or time.monotonic() > deadline:
                    errors_file.seek(0)
                    raise RuntimeError(f"child {proc.args!r} did not become ready "
                                       f"(said {line!r}): {errors_file.read()[-4000:]}")
            watched = [psutil.Process(p.pid) for p in procs]
            time.sleep(settle)
            started = time.perf_counter()
            cpu0 = [_cpu(w) for w in watched]
            time.sleep(seconds)
            cpu1 = [_cpu(w) for w in watched]
            wall = time.perf_counter() - started
            rss = [int(w.memory_info().rss) for w in watched]
            for proc in procs:
                if proc.wait(timeout=settle + seconds + 60) != 0:
                    errors_file.seek(0)
                    raise RuntimeError(f"child {proc.args!r} exited {proc.returncode}: "
                                       f"{errors_file.read()[-4000:]}")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                if proc.stdout is not None:
                    proc.stdout.close()
    return [Usage(c1 - c0, wall, r, s)
            for c0, c1, r, s in zip(cpu0, cpu1, rss, said, strict=True)]


def python_module(module: str, *args: str) -> list[str]:
    """argv running `python -m module args...` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def cpu_count() -> int:
    return os.cpu_count() or 1


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this run's own (Debian's, as the tests start it:
    tests/servers.py), with fsync on as a deployment has it; stopped after."""
    from tests.servers import PostgresServer

    with tempfile.TemporaryDirectory(prefix="pulse-bench-pg-") as root:
        os.chmod(root, 0o755)  # the server runs as the postgres user under root
        server = PostgresServer(Path(root) / "pg", fsync=True).init()
        try:
            yield server
        finally:
            server.stop("immediate")


@contextmanager
def postgres_database() -> Iterator[str]:
    """The URL of a new database in a server of this run's own (`postgres_server`)."""
    with postgres_server() as server:
        yield server.create_database()


def on_postgres(url: str | None, run: Callable[[str], Coroutine[Any, Any, Report]]) -> int:
    """Run `run` on the database `url`, or on a server of this run's own when there is none
    (`postgres_database`); the report's exit code."""
    if url:
        return asyncio.run(run(url)).exit_code()
    with postgres_database() as fresh:
        return asyncio.run(run(fresh)).exit_code()


# -- limits: raw PostgreSQL -----------------------------------------------------------------

RAW_COLUMNS = COLUMNS.removeprefix("seq, ")
"""The columns a raw row gives: seq comes from the raw table's identity column."""
RAW_TABLE = """
DROP TABLE IF EXISTS raw_events;
CREATE TABLE raw_events (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id text NOT NULL, kind text NOT NULL,
    key text NOT NULL, version bigint NOT NULL, ts bigint NOT NULL, origin text NOT NULL,
    cause bigint, tx text NOT NULL, idem text, data bytea, hash text);
CREATE UNIQUE INDEX raw_events_idem ON raw_events (idem) WHERE idem IS NOT NULL;
CREATE INDEX raw_events_key ON raw_events (key, seq);
CREATE INDEX raw_events_kind ON raw_events (kind, seq);
CREATE INDEX raw_events_origin ON raw_events (origin text_pattern_ops, seq);
"""
"""The raw limit's table, made anew: the columns and indexes of pulse's PostgreSQL events
table (pulse_core/store/_pg_ddl.py, schema 4; tests/bench pins them), seq from an identity
column (no ordering, versions or idempotency)."""
RAW_INSERT = f"INSERT INTO raw_events ({RAW_COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
"""One raw row (psycopg placeholders, `RAW_COLUMNS` order)."""
RAW_INSERT_UNNEST = (
    f"INSERT INTO raw_events ({RAW_COLUMNS}) "
    "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::bigint[], %b::bigint[], "
    "%b::text[], %b::bigint[], %b::text[], %b::text[], %b::bytea[], %b::text[])")
"""Many raw rows in one statement, given as one array a column (`RAW_COLUMNS` order)."""


# -- PostgreSQL: an engine's executors in another process -----------------------------------


class Ping(Effect, tag="bench-ping"):
    """A no-op effect numbered so the process that enters it can say which one it was."""

    any_host = True
    timeout = 5.0
    n: int


class EntryPrinter(Executor):
    """Prints `<n> <perf_counter>` the moment `execute` is entered, then returns at once."""

    handles = (Ping,)

    async def execute(self, effect: Any, ctx: ExecutionContext) -> Any:
        sys.stdout.write(f"{effect.n} {time.perf_counter()!r}\n")
        sys.stdout.flush()
        return None


async def executor_process(url: str, concurrency: int) -> None:
    """A child process's engine executors: an ExecutorLoop on the log at `url` running
    EntryPrinter (`concurrency` effects at once), woken by LISTEN/NOTIFY; prints `ready`
    once started and runs until stdin closes (or the process is killed)."""
    store = await open_event_store(url)
    loop = ExecutorLoop(store, [EntryPrinter()], concurrency=concurrency)
    runner = asyncio.create_task(loop.run())
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    await store.close()
