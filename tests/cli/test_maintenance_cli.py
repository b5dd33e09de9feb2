"""`upulse maintenance report|history|health|run` as a real process on real homes: reading
a home's cycles without a daemon, and asking a running daemon for a cycle."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from pulse_adapters.maintenance import run_cycle
from pulse_core import EventDraft, ManualClock, MemoryBoard, SqliteEventStore, identity_key
from tests.cli.runner import Upulse, wait_until

DAY = 86_400_000
TEST_TIME_LIMIT_S = 120


async def two_cycles(home: Path, *, overdue: bool) -> list[str]:
    """Two cycles over ana's memory (the second with an overdue commitment if `overdue`);
    their ids, oldest first."""
    clock = ManualClock()
    store = await SqliteEventStore.open(home / "events.db", clock=clock)
    try:
        await MemoryBoard(store).exchange("ana", "hi")
        first = await run_cycle(store, clock=clock, cycle="night-1", trigger="scheduled")
        if overdue:
            await store.append([EventDraft(
                "commitment-made", identity_key("ana"),
                {"record": "c-call", "text": "call Ana back", "due_at": clock.now_ms() + DAY},
                origin="agent")])
        clock.advance(2 * DAY)
        second = await run_cycle(store, clock=clock, cycle="night-2")
        return [first.cycle, second.cycle]
    finally:
        await store.close()


def fingerprint(home: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(home.iterdir()) if p.is_file()}


def test_history_report_and_health_read_a_home_without_a_daemon(upulse: Upulse,
                                                                tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    asyncio.run(two_cycles(home, overdue=True))
    before = fingerprint(home)
    history: Any = upulse.json("maintenance", "history", "--home", home)
    assert [(c["cycle"], c["trigger"], c["status"]) for c in history] == [
        ("night-2", "on-demand", "completed"), ("night-1", "scheduled", "completed")]
    assert history[0]["took_ms"] == 0  # a ManualClock that did not move within the cycle
    assert history[0]["changes"]["overdue_surfaced"] == 1
    assert (history[0]["healthy"], history[1]["healthy"]) == (False, True)
    table = upulse("maintenance", "history", "--limit", "1", "--home", home).stdout
    assert table.splitlines()[0].split() == ["CYCLE", "TRIGGER", "BEGAN", "STATUS", "TOOK",
                                             "OUTCOME", "CHANGES", "HEALTH"]
    assert "night-2" in table and "night-1" not in table and "UNHEALTHY" in table

    report: Any = upulse.json("maintenance", "report", "--home", home)
    assert (report["cycle"], report["overdue"]) == ("night-2", ["ana/c-call"])
    named: Any = upulse.json("maintenance", "report", "night-1", "--home", home)
    assert (named["cycle"], named["trigger"]) == ("night-1", "scheduled")
    text = upulse("maintenance", "report", "--home", home).stdout
    assert text.startswith("cycle night-2 (on-demand): completed")
    assert "overdue: ana/c-call" in text and "health: 10 of 11 signals hold" in text

    unhealthy = upulse("maintenance", "health", "--home", home, "--json", ok=False)
    assert unhealthy.returncode == 3
    shown = json.loads(unhealthy.stdout)
    assert (shown["cycle"], shown["healthy"], len(shown["signals"])) == ("night-2", False, 11)
    failing = [s["name"] for s in shown["signals"] if not s["healthy"]]
    assert failing == ["overdue_commitments"]
    listed = upulse("maintenance", "health", "--home", home, ok=False).stdout
    assert "overdue_commitments" in listed and "NOT OK: surface to the agent" in listed
    assert "skills_awaiting_verdict" in listed and "trials_starved_of_outcomes" in listed
    assert fingerprint(home) == before  # read-only: not one byte written


def test_health_exits_0_when_every_signal_holds(upulse: Upulse, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    asyncio.run(two_cycles(home, overdue=False))
    assert upulse("maintenance", "health", "--home", home).returncode == 0


def test_a_home_without_cycles_or_a_cycle_it_lacks_is_named(upulse: Upulse,
                                                            tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    empty = upulse("maintenance", "report", "--home", home, ok=False)
    assert empty.returncode == 1
    assert "no maintenance cycle has ended in this home yet" in empty.stderr
    assert upulse("maintenance", "history", "--home", home).stdout.startswith(
        "no maintenance cycle has begun")
    (tmp_path / "other").mkdir()
    asyncio.run(two_cycles(tmp_path / "other", overdue=False))
    missing = upulse("maintenance", "report", "night-9", "--home", tmp_path / "other", ok=False)
    assert "no maintenance cycle 'night-9'" in missing.stderr
    assert upulse("maintenance", "history", "--limit", "0", "--home", home,
                  ok=False).returncode == 2


def configure_maintenance(home: Path, settings: dict[str, Any]) -> None:
    config = json.loads((home / "config.json").read_text())
    config["layers"] = {**config.get("layers", {}), "maintenance": settings}
    (home / "config.json").write_text(json.dumps(config))


async def last_seq(home: Path) -> int:
    store = await SqliteEventStore.open(home / "events.db", read_only=True)
    try:
        return await store.last_seq()
    finally:
        await store.close()


def test_run_writes_nothing_when_no_daemon_would_run_the_cycle(upulse: Upulse,
                                                               tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    head = asyncio.run(last_seq(home))
    no_layer = upulse("maintenance", "run", "--home", home, ok=False)
    assert no_layer.returncode == 1 and "does not name the `maintenance` layer" in no_layer.stderr
    configure_maintenance(home, {"triggers": {"on_demand": False}})
    ignored = upulse("maintenance", "run", "--home", home, ok=False)
    assert "triggers.on_demand is false" in ignored.stderr
    configure_maintenance(home, {})
    stopped = upulse("maintenance", "run", "--home", home, ok=False)
    assert stopped.returncode == 3 and "no daemon is running" in stopped.stderr
    assert asyncio.run(last_seq(home)) == head


def test_run_asks_the_running_daemon_for_a_cycle(upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    configure_maintenance(home, {"schedule": {"every_h": None}})
    upulse("daemon", "start", "--home", home)
    asked: Any = upulse.json("maintenance", "run", "--reason", "after the import",
                             "--home", home)
    assert (asked["kind"], asked["origin"], asked["data"]) == (
        "maintenance-requested", "cli", {"reason": "after the import"})

    def ended() -> Any:
        rows: Any = upulse.json("maintenance", "history", "--home", home)
        return [r for r in rows if r["status"] != "running"]

    rows: Any = wait_until(ended, 60, "the requested cycle to end")
    (cycle,) = rows
    assert (cycle["trigger"], cycle["status"]) == ("on-demand", "completed")
    report: Any = upulse.json("maintenance", "report", "--home", home)
    assert report["cycle"] == cycle["cycle"] and len(report["health"]) == 11


async def cycle_left_running(home: Path) -> None:
    """A cycle an engine died in: begun, never ended."""
    async def crash(run: object) -> None:
        raise asyncio.CancelledError  # the engine died under it: it stays running

    store = await SqliteEventStore.open(home / "events.db")
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await run_cycle(store, cycle="lost", steps=[("crash", crash)])
    finally:
        await store.close()


def test_a_cycle_still_running_has_no_report_yet(upulse: Upulse, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    asyncio.run(cycle_left_running(home))
    running = upulse("maintenance", "report", "lost", "--home", home, ok=False)
    assert running.returncode == 1
    assert "maintenance cycle 'lost' is running and has no report yet" in running.stderr
    history: Any = upulse.json("maintenance", "history", "--home", home)
    assert [(c["cycle"], c["status"], c["took_ms"]) for c in history] == [
        ("lost", "running", None)]
