"""Every benchmark runs end to end at tiny sizes and prints figure | limit | ratio, so none rots.

Floors are not judged here: tiny runs on a busy CI machine say nothing about them.
The PostgreSQL ones run against the test server (tests/servers.py); bench.pg_drivers is
left out, since it needs asyncpg, which pulse does not depend on.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bench.disk import WriteGate

TEST_TIME_LIMIT_S = 60

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^(?P<figure>[^|]+: [\d,.]+ [^|]+) \| (?P<limit>[^|]+: [\d,.]+ [^|]+) \| "
                  r"ratio (?P<ratio>[\d.]+|inf) \((?P<floor>[^)]*)\)(?P<verdict> PASS| FAIL)?$")


def bench(name: str) -> ModuleType:
    """bench.<name>, importable however pytest was started."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(f"bench.{name}")


def report_lines(out: str) -> list[re.Match[str]]:
    return [m for m in (LINE.match(line) for line in out.splitlines()) if m]


def check(out: str, figures: list[str], limits: list[str], floors: int) -> None:
    lines = report_lines(out)
    assert lines, out
    for figure in figures:
        assert any(figure in m["figure"] for m in lines), (figure, out)
    for limit in limits:
        assert any(limit in m["limit"] for m in lines), (limit, out)
    assert sum(1 for m in lines if m["verdict"]) == floors, out
    for m in lines:
        assert m["ratio"] == "inf" or float(m["ratio"]) >= 0, out


def test_append(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("append").main(["--events", "200", "--single-events", "64", "--tmp", str(tmp_path)])
    check(capsys.readouterr().out,
          ["append 1 appender x 100 drafts/call", "append 32 appenders x 100 drafts/call",
           "append 1 appender x 1 draft/call", "append 32 appenders x 1 draft/call",
           "raw sqlite3 executemany 32 rows/commit (the ceiling of a group commit of them)"],
          ["raw sqlite3 executemany 100 rows/commit, interleaved",
           "raw sqlite3 executemany 100 rows/commit", "raw sqlite3 executemany 1 row/commit"],
          floors=2)


def test_agent_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("agent_runs").main(["--tasks", "5", "--tmp", str(tmp_path)])
    check(capsys.readouterr().out, ["agent run p50", "agent run p99"],
          ["bare subprocess spawn+exit p50", "bare subprocess spawn+exit p99"], floors=1)


def test_dispatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("dispatch").main(["--effects", "100", "--tmp", str(tmp_path)])
    check(capsys.readouterr().out, ["dispatch p50", "dispatch p99"],
          ["bare asyncio.Event wake-up p50", "bare asyncio.Event wake-up p99",
           "raw sqlite3 1-row FULL commit p99"], floors=1)


def test_tick_scale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("tick_scale").main(["--small", "1000", "--large", "5000", "--ticks", "5",
                              "--tmp", str(tmp_path)])
    check(capsys.readouterr().out,
          ["tick at 5,000 events", "tick at 1,000 events", "first open at 5,000 events",
           "reopen at 5,000 events"],
          ["tick at 1,000 events", "raw sqlite3 SELECT WHERE seq > ?", "raw sqlite3 full scan"],
          floors=1)


def test_tick_scale_tasks_mix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("tick_scale").main(["--small", "200", "--large", "1000", "--ticks", "3",
                              "--mix", "tasks", "--tmp", str(tmp_path)])
    check(capsys.readouterr().out, ["tick at 1,000 events"], ["tick at 200 events"], floors=1)


def test_idle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("idle").main(["--seconds", "2", "--settle", "0", "--tmp", str(tmp_path)])
    check(capsys.readouterr().out, ["idle engine CPU", "idle engine RSS"],
          ["idle asyncio loop CPU", "idle asyncio loop RSS"], floors=1)


def test_append_latency(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("append_latency").main(["--appends", "50", "--tmp", str(tmp_path)])
    check(capsys.readouterr().out,
          ["pulse append p50", "pulse append p99", "pulse append 1 draft/call",
           "eventsourcing insert_events p50", "raw sqlite3 1-row commits, COMMIT in a thread"],
          ["raw sqlite3 1-row commit p50", "raw sqlite3 1-row commit p99",
           "raw sqlite3 1-row commits", "raw sqlite3 1-row commits, COMMIT in a thread"],
          floors=1)


def test_stall(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("stall").main(["--hold", "0.4", "--appends", "5", "--tmp", str(tmp_path)])
    disk = WriteGate.available()  # the stalled disk's two floors, where it can be held back
    check(capsys.readouterr().out,
          ["longest loop stall during the hold", "quiet engine.tick() p99 during the hold",
           "survival decision", *(["longest loop stall while the disk stalls"] if disk else [])],
          ["the hold", "quiet engine.tick() p99 before it"], floors=4 if disk else 2)


def test_pg_append(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    bench("pg_append").main(["--events", "400", "--processes", "2", "--producers", "4",
                             "--batch", "10", "--url", pg_url])
    check(capsys.readouterr().out, ["EventStore.append 4 producers x 10 drafts/call"],
          ["raw psycopg executemany 10 rows/transaction"], floors=1)


def test_pg_dispatch(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    bench("pg_dispatch").main(["--effects", "20", "--url", pg_url])
    check(capsys.readouterr().out, ["dispatch p50", "dispatch p99"],
          ["bare NOTIFY sent -> heard in another process p99", "bare NOTIFY round trip p99"],
          floors=1)


def test_pg_single(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    bench("pg_single").main(["--appends", "16", "--url", pg_url])
    check(capsys.readouterr().out,
          ["pulse 1 writer, 1 event per append", "pulse 1 writer, 100 events per append",
           "pulse 8 writers, 1 event per append"],
          ["raw psycopg INSERT per commit"], floors=3)


def test_pg_fleet(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    bench("pg_fleet").main(["--engines", "2", "--effects", "40", "--rate", "100",
                            "--url", pg_url])
    check(capsys.readouterr().out, ["dispatch p50", "dispatch p99", "effects acked exactly once"],
          ["raw 1-row INSERT + COMMIT p99", "effects appended"], floors=2)


def test_pg_fleet_restarts_its_own_server_and_every_effect_is_still_acked_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    bench("pg_fleet").main(["--engines", "2", "--effects", "40", "--rate", "100"])
    out = capsys.readouterr().out
    check(out, ["dispatch p99 outside the restart", "effects acked exactly once"],
          ["raw 1-row INSERT + COMMIT p99"], floors=2)
    assert re.search(r"^  restart: the server was down \d+ ms", out, re.MULTILINE), out
    once = next(m for m in report_lines(out) if "acked exactly once" in m["figure"])
    assert once["verdict"] == " PASS", out  # correctness, not speed: judged even here


def test_pg_scale(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    bench("pg_scale").main(["--small", "200", "--large", "2000", "--ticks", "5", "--warmup",
                            "1", "--url", pg_url])
    check(capsys.readouterr().out, ["tick at 2,000 events"], ["tick at 200 events"], floors=1)


def test_web_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("web_load").main(["--ticks", "20", "--rounds", "1", "--warmup", "5", "--streams", "2",
                            "--settle", "0", "--tmp", str(tmp_path)])
    check(capsys.readouterr().out,
          ["tick p50 with 2 streams + API client", "tick p99 with 2 streams + API client",
           "tick p99 beside a neutral CPU neighbour"],
          ["tick p50 with no client", "tick p99 with no client",
           "tick p99 beside a neutral CPU neighbour"], floors=1)


def test_web_events_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("web_events_page").main(["--events", "3000", "--repeats", "5", "--budget", "1",
                                   "--tmp", str(tmp_path)])
    check(capsys.readouterr().out,
          ["events page, no filter p50", "events page, kind=task-created p50",
           "events page, origin=executor: p50", "events page, kind=error",
           "GET /api/events?limit=100 round trip p50"],
          ["raw sqlite3 SELECT <columns> ORDER BY seq DESC LIMIT 100",
           "raw sqlite3 SELECT <columns> WHERE kind = ? ORDER BY seq DESC LIMIT 100",
           "raw sqlite3 SELECT <columns> WHERE substr(origin, 1, 9) = ?"], floors=4)


def test_tick_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("tick_records").main(["--ticks", "6", "--rounds", "2", "--tmp", str(tmp_path)])
    check(capsys.readouterr().out,
          ["tick p50 with records", "added per writing tick p50", "bytes per tick record",
           "ObjectStore.put_sync of a record p50"],
          ["tick p50 without records", "raw durable file write p50",
           "bytes of that tick's events"], floors=1)


def test_sealing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("sealing").main(["--elements", "200", "--batch", "50", "--tmp", str(tmp_path)])
    check(capsys.readouterr().out, ["sealed write", "sealed read+open"],
          ["plain write", "plain read"], floors=0)


def test_reviewer_tick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("reviewer_tick").main(["--identities", "200", "--hours", "0.25", "--tmp",
                                 str(tmp_path)])
    check(capsys.readouterr().out,
          ["awareness rule per tick p99", "awareness rule per tick p50"],
          ["goal", "bare dict scan of 200 identities"], floors=1)


def test_recall(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench("recall").main(["--elements", "300", "--identities", "20", "--repeat", "1",
                          "--steady", "2", "--tmp", str(tmp_path)])
    check(capsys.readouterr().out, ["warm Recaller rare word", "one-shot recall() common word",
                                    "warm Recaller rare word, 2 calls"],
          ["raw FTS5 MATCH"], floors=1)
