"""`upulse events|effects|tasks|vitals|tick|task`: the log from the shell, as a real process."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from pulse_cli.output import printable
from pulse_core import EventDraft, ManualClock, SqliteEventStore, VitalsStore
from pulse_core._effects import effect_draft
from pulse_survival import Notify
from tests.cli.runner import Upulse, wait_until
from tests.cli.support import configure, git, install_probe_layer

HOUR_MS = 3_600_000


async def append(home: Path, drafts: list[EventDraft], clock: ManualClock | None = None
                 ) -> None:
    store = await SqliteEventStore.open(home / "events.db", clock=clock)
    try:
        await store.append(drafts)
    finally:
        await store.close()


def notice(text: str) -> EventDraft:
    return EventDraft("notification", "cli-test", {"text": text}, origin="human")


def test_printable_escapes_every_control_character_and_keeps_other_text() -> None:
    assert printable("\x1b]0;title\x07 \x1b[2J \x9b2J \x7f \x00\r") == (
        "\\x1b]0;title\\x07 \\x1b[2J \\x9b2J \\x7f \\x00\\x0d")
    assert printable("café 中文 → ok\tend\n") == "café 中文 → ok\\x09end\\x0a"
    assert printable("one\ntwo\x1b", newlines=True) == "one\ntwo\\x1b"


async def test_events_json_lists_the_log_with_every_field(upulse: Upulse, tmp_path: Path
                                                          ) -> None:
    home = upulse.init(tmp_path / "home")
    await append(home, [notice("one"), notice("two")])
    listed = upulse.json("events", "--home", home)
    assert isinstance(listed, list)
    assert [(e["seq"], e["kind"], e["data"]["text"]) for e in listed] == [
        (1, "notification", "one"), (2, "notification", "two")]
    assert set(listed[0]) >= {"seq", "id", "kind", "key", "version", "ts", "origin", "data"}
    human = upulse("events", "--home", home).stdout
    assert "SEQ" in human and "notification" in human and "ago" in human


async def test_events_filter_by_kind_key_and_since_a_duration_or_a_seq(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    await append(home, [notice("an hour ago")], ManualClock(time.time_ns() // 1_000_000 - HOUR_MS))
    await append(home, [notice("now"), EventDraft("task-created", "t-9", {"title": "x"})])
    recent = upulse.json("events", "--home", home, "--since", "5m")
    assert [e["seq"] for e in recent] == [2, 3]  # type: ignore[union-attr]
    kinds = upulse.json("events", "--home", home, "--kind", "task-created")
    assert [e["key"] for e in kinds] == ["t-9"]  # type: ignore[union-attr]
    both = upulse.json("events", "--home", home, "--kind", "task-created",
                       "--kind", "notification", "--since", "1")
    assert [e["seq"] for e in both] == [2, 3]  # type: ignore[union-attr]
    assert upulse.json("events", "--home", home, "--key", "t-9", "--since", "2h") != []
    bad = upulse("events", "--home", home, "--since", "yesterday", ok=False)
    assert bad.returncode == 2 and "duration" in bad.stderr


async def test_effects_pending_lists_only_effects_without_a_final_outcome(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    waiting = effect_draft(Notify(topic="disk", level="warn", text="waiting"), origin="agent")
    done = effect_draft(Notify(topic="disk", level="info", text="done"), origin="agent")
    broken = effect_draft(Notify(topic="disk", level="info", text="broken"), origin="agent")
    await append(home, [waiting, done, broken])
    await append(home, [
        EventDraft("effect-acked", done.key, {"attempt": 1, "result": "ok"}, origin="agent"),
        EventDraft("effect-failed", broken.key, {"attempt": 1, "error": "no", "final": True},
                   origin="agent"),
    ])
    pending = upulse.json("effects", "--home", home, "--pending")
    assert [(e["id"], e["type"], e["status"]) for e in pending] == [  # type: ignore[union-attr]
        (waiting.key, "notify", "pending")]
    failed = upulse.json("effects", "--home", home, "--failed")
    assert [(e["id"], e["error"]) for e in failed] == [  # type: ignore[union-attr]
        (broken.key, "no")]
    table = upulse("effects", "--home", home).stdout
    assert "pending" in table and "acked" in table and "failed" in table


def test_a_task_moves_through_its_lifecycle_from_the_command_line(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("task", "create", "t-1", "--title", "write the docs", "--priority", "3",
           "--home", home)
    upulse("task", "assign", "t-1", "ada", "--home", home)
    early = upulse("task", "close", "t-1", "--home", home, ok=False)
    assert early.returncode == 1 and "needs task 't-1' to be acked; it is assigned" in early.stderr
    upulse("task", "start", "t-1", "--home", home)
    upulse("task", "ack", "t-1", "--result", '{"pages": 4}', "--home", home)
    upulse("task", "close", "t-1", "--home", home)
    upulse("task", "create", "t-2", "--title", "never mind", "--home", home)
    upulse("task", "give-up", "t-2", "--reason", "superseded", "--home", home)
    again = upulse("task", "create", "t-1", "--title", "twice", "--home", home, ok=False)
    assert again.returncode == 1 and "task t-1 exists (status closed)" in again.stderr
    tasks = upulse.json("tasks", "--home", home)
    assert isinstance(tasks, list)
    by_id = {t["id"]: t for t in tasks}
    assert by_id["t-1"]["status"] == "closed" and by_id["t-1"]["agent"] == "ada"
    assert by_id["t-1"]["result"] == {"pages": 4} and by_id["t-1"]["priority"] == 3
    assert by_id["t-2"]["status"] == "given-up" and by_id["t-2"]["reason"] == "superseded"
    assert "write the docs" in upulse("tasks", "--home", home).stdout
    bad = upulse("task", "ack", "t-1", "--result", "{not json", "--home", home, ok=False)
    assert bad.returncode == 2


async def test_vitals_shows_the_latest_reading_of_each_key_and_the_samples_of_one(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    store = await VitalsStore.open(home / "vitals.db")
    try:
        await store.record("load", {"per_core": 0.5})
        await store.record("load", {"per_core": 0.7})
        await store.record("disk", error="unreadable")
    finally:
        await store.close()
    latest = upulse.json("vitals", "--home", home)
    assert [(s["key"], s["data"], s["error"]) for s in latest] == [  # type: ignore[union-attr]
        ("disk", None, "unreadable"), ("load", {"per_core": 0.7}, None)]
    samples = upulse.json("vitals", "load", "--home", home)
    assert [s["data"]["per_core"] for s in samples] == [0.5, 0.7]  # type: ignore[union-attr]
    assert "error" in upulse("vitals", "--home", home).stdout


def fingerprint(db: Path) -> tuple[str, int]:
    conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        conn.close()
    return hashlib.sha256(db.read_bytes()).hexdigest(), rows


async def test_tick_verbose_prints_each_rules_decision_and_writes_nothing(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    await append(home, [notice("before the tick")])
    events_before = fingerprint(home / "events.db")
    vitals_before = hashlib.sha256((home / "vitals.db").read_bytes()).hexdigest()
    verbose = upulse("tick", "--verbose", "--home", home).stdout
    for rule in ("panic_rollback", "error_escalate", "clamp_tick", "dedup"):
        assert rule in verbose
    assert "decision: 0 effects, 200 ms" in verbose
    report = upulse.json("tick", "--home", home)
    assert isinstance(report, dict)
    assert report["seq"] == 1 and report["decision"] == {"effects": [], "tick_ms": 200}
    assert [r["rule"] for r in report["rules"]][:2] == ["panic_rollback", "auto_rollback"]
    assert fingerprint(home / "events.db") == events_before
    assert hashlib.sha256((home / "vitals.db").read_bytes()).hexdigest() == vitals_before
    assert not (home / "engine.lock").exists()


async def test_dev_runs_the_staging_code_on_a_scratch_copy_and_leaves_the_home_untouched(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    await append(home, [notice("before dev")])
    before = fingerprint(home / "events.db")
    done = upulse("dev", "--seconds", "1", "--home", home)
    assert "engine-started" in done.stdout  # the scratch engine's, printed as it happens
    assert "dev: stopped; the scratch copy is gone" in done.stdout
    assert fingerprint(home / "events.db") == before


async def test_tick_runs_the_engine_the_daemon_would_build_with_what_its_watchers_see_now(
        upulse: Upulse, tmp_path: Path) -> None:
    site = install_probe_layer(tmp_path / "site")
    upulse.env["PYTHONPATH"] = os.pathsep.join([str(site), upulse.env["PYTHONPATH"]])
    home = upulse.init(tmp_path / "home")
    configure(home, layers={"probe": {"tag": "t"}})
    # The tick runs on a scratch copy of the home's stores; an inbox outside the home is
    # what its watcher sees now, wherever the engine runs.
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for name in ("a.txt", "b.txt"):
        (inbox / name).write_text("hello")
    settings = home / "engine" / "config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "inbox": str(inbox)}))
    git(home / "engine", "commit", "-qam", "inbox outside")
    report = upulse.json("tick", "--home", home)
    assert isinstance(report, dict)
    assert report["decision"]["effects"] == [
        {"type": "note", "text": "2 message(s) waiting in the inbox"}]
    traces = {r["rule"]: r for r in report["rules"]}
    assert (traces["probe_passes"]["tier"], traces["inbox_note"]["tier"]) == ("probe", "engine")
    assert traces["inbox_note"]["effects"] == ["note"] and traces["inbox_note"]["reached"]
    verbose = upulse("tick", "--verbose", "--home", home).stdout
    assert "inbox_note              engine    1 effects (note)" in verbose
    assert not (home / "notes.md").exists()  # executors never run in a dry tick


def test_dev_rebuilds_the_whole_engine_when_staging_or_config_json_change(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    out = tmp_path / "dev.out"
    with out.open("wb") as sink:
        child = subprocess.Popen(
            [sys.executable, "-m", "pulse_cli", "dev", "--seconds", "40", "--home", str(home)],
            env=upulse.env, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: "Ctrl-C stops" in out.read_text(), 20, "dev to start")
        entry = home / "staging" / "engine.py"
        good = entry.read_text()
        entry.write_text(good + "\ndef broken(:\n")
        wait_until(lambda: "reload failed, the previous engine keeps running" in
                   out.read_text(), 20, "dev to refuse the broken code")
        entry.write_text(good)
        wait_until(lambda: "dev: reloaded" in out.read_text(), 20, "dev to reload")
        configure(home, default_tick_ms=300)
        wait_until(lambda: out.read_text().count("dev: reloaded") >= 2, 20,
                   "dev to reload on a config.json change")
        wait_until(lambda: out.read_text().count(" engine-started ") >= 3, 10,
                   "the printed events of three engines")
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=20)
    assert "dev: stopped; the scratch copy is gone" in out.read_text()


async def queried_home(upulse: Upulse, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A home with events, an effect and a vital; and its files' hashes before any query."""
    home = upulse.init(tmp_path / "home")
    await append(home, [notice("one"), effect_draft(Notify(topic="t", level="info", text="x"),
                                                    origin="agent")])
    store = await VitalsStore.open(home / "vitals.db")
    try:
        await store.record("load", {"per_core": 0.5})
    finally:
        await store.close()
    return home, home_files(home)


def home_files(home: Path) -> dict[str, str]:
    return {str(p.relative_to(home)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(home.iterdir()) if p.is_file()}


def run_every_query(upulse: Upulse, home: Path) -> None:
    for command in (["events"], ["effects"], ["tasks"], ["vitals"], ["vitals", "load"]):
        upulse(*command, "--home", home)
    assert upulse("daemon", "status", "--home", home, ok=False).returncode == 3


async def test_queries_open_the_home_read_only_and_change_no_store(
        upulse: Upulse, tmp_path: Path) -> None:
    home, before = await queried_home(upulse, tmp_path)
    run_every_query(upulse, home)
    after = home_files(home)
    assert {name: after[name] for name in before} == before


async def test_queries_leave_no_file_behind(upulse: Upulse, tmp_path: Path) -> None:
    home, before = await queried_home(upulse, tmp_path)
    run_every_query(upulse, home)
    assert sorted(home_files(home)) == sorted(before)
