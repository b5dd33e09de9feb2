"""`upulse effects cancel|retry ID`: a real process on a real home, with a running daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pulse_core import EventDraft, SqliteEventStore
from pulse_core._effects import effect_draft
from pulse_survival import Notify
from tests.cli.runner import Upulse, wait_until

TEST_TIME_LIMIT_S = 90


async def append(home: Path, drafts: list[EventDraft]) -> None:
    store = await SqliteEventStore.open(home / "events.db")
    try:
        await store.append(drafts)
    finally:
        await store.close()


def listed(upulse: Upulse, *args: str | Path) -> list[dict[str, Any]]:
    """What a listing command prints with --json."""
    rows = upulse.json(*args)
    assert isinstance(rows, list)
    return rows


def effects_by_id(upulse: Upulse, home: Path, *flags: str) -> dict[str, Any]:
    return {effect["id"]: effect for effect in listed(upulse, "effects", "--home", home,
                                                      *flags)}


async def test_the_running_daemon_skips_a_cancelled_effect_and_runs_a_retried_one(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("daemon", "start", "--home", home)
    # Bound to another host, so this daemon leaves it pending: only a cancel moves it.
    waiting = effect_draft(Notify(topic="disk", level="warn", text="waiting"), origin="agent",
                           host="another-host")
    # Failed for good in the same append, so the daemon never claims it before the retry.
    failed = effect_draft(Notify(topic="disk", level="info", text="again"), origin="agent")
    await append(home, [waiting, failed, EventDraft(
        "effect-failed", failed.key, {"attempt": 3, "error": "webhook down", "final": True},
        origin="executor:NotifyExecutor")])

    cancelled = upulse("effects", "cancel", waiting.key, "--reason", "the disk is fine",
                       "--home", home)
    assert cancelled.stdout.strip() == (
        f"effect {waiting.key} cancelled (it was pending; event #{_seq(upulse, home)}) — no "
        "executor loop will run it")
    retried = upulse.json("effects", "retry", failed.key, "--home", home)
    assert isinstance(retried, dict)
    assert (retried["kind"], retried["key"], retried["origin"], retried["data"]) == (
        "effect-retried", failed.key, "human:cli",
        {"reason": "retry from the command line", "was": "failed"})

    wait_until(lambda: effects_by_id(upulse, home)[failed.key]["status"] == "acked", 20,
               "the daemon to run the retried effect")
    after = effects_by_id(upulse, home)
    assert after[failed.key]["attempt"] == 4  # numbered on from the three before the retry
    assert after[waiting.key]["status"] == "cancelled"
    assert waiting.key not in effects_by_id(upulse, home, "--pending")
    assert effects_by_id(upulse, home, "--failed") == {}
    notices = listed(upulse, "events", "--home", home, "--kind", "notification")
    assert [n["data"]["effect"] for n in notices] == [failed.key]
    claims = listed(upulse, "events", "--home", home, "--kind", "effect-executing")
    assert [c["key"] for c in claims] == [failed.key]
    table = upulse("effects", "--home", home).stdout
    assert "cancelled" in table and "acked" in table


def _seq(upulse: Upulse, home: Path) -> int:
    (cancel,) = listed(upulse, "events", "--home", home, "--kind", "effect-cancelled")
    return int(cancel["seq"])


async def test_refused_controls_exit_1_naming_what_is_wrong_and_write_nothing(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    done = effect_draft(Notify(topic="t", level="info", text="done"), origin="agent")
    await append(home, [done, EventDraft("effect-acked", done.key, {"attempt": 1,
                                                                    "result": "ok"},
                                         origin="agent")])
    before = upulse.json("events", "--home", home, "--limit", "0")
    unknown = upulse("effects", "cancel", "e-404", "--home", home, ok=False)
    assert unknown.returncode == 1
    assert "no effect 'e-404' in this log — `upulse effects` lists" in unknown.stderr
    acked = upulse("effects", "retry", done.key, "--home", home, ok=False)
    assert acked.returncode == 1
    assert f"effect {done.key} is acked (attempt 1) — it ran; record a new" in acked.stderr
    cancel_acked = upulse("effects", "cancel", done.key, "--home", home, ok=False)
    assert cancel_acked.returncode == 1
    assert "cancel applies to pending or retrying effects" in cancel_acked.stderr
    assert upulse.json("events", "--home", home, "--limit", "0") == before
    usage = upulse("effects", "cancel", "--home", home, ok=False)
    assert usage.returncode == 2 and "ID" in usage.stderr
