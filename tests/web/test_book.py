"""The UI's LogBook: every effect counted, the ones an operator acts on kept whole."""

from __future__ import annotations

from pathlib import Path

from pulse_adapters.web import _book
from pulse_adapters.web._book import LogBook
from pulse_core import EventDraft, SqliteEventStore


def lifecycle(n: int, outcome: str) -> list[EventDraft]:
    key = f"e-{n}"
    drafts = [EventDraft("effect", key, {"effect": {"type": "ping"}, "dedup": key},
                         origin="engine:tick"),
              EventDraft("effect-executing", key, {"attempt": 1, "lease_until": 0,
                                                   "owner": "t"})]
    if outcome == "acked":
        drafts.append(EventDraft("effect-acked", key, {"attempt": 1, "result": None}))
    elif outcome == "failed":
        drafts.append(EventDraft("effect-failed", key, {"attempt": 1, "error": "no",
                                                        "final": True}))
    return drafts


async def test_old_acked_effects_are_counted_not_kept_and_failed_ones_are_kept(
        tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    saved, _book.ACKED_KEPT = _book.ACKED_KEPT, 3
    try:
        book = LogBook(store)
        for n in range(10):
            await store.append(lifecycle(n, "failed" if n == 1 else "acked"))
        await store.append(lifecycle(10, "running"))
        await book.catch_up()
        assert book.counts["acked"] == 9 and book.counts["failed"] == 1
        assert book.counts["executing"] == 1
        assert set(book.effects) == {"e-1", "e-7", "e-8", "e-9", "e-10"}
        await store.append([EventDraft("effect-acked", "e-10", {"attempt": 1})])
        await book.catch_up()
        assert book.counts["executing"] == 0 and book.counts["acked"] == 10
        assert "e-7" not in book.effects and "e-10" in book.effects
    finally:
        _book.ACKED_KEPT = saved
        await store.close()


async def test_survival_decisions_are_kept_once_their_types_are_known(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        await store.append([
            EventDraft("effect", "r-1", {"effect": {"type": "restart-process", "name": "x"}},
                       origin="engine:tick"),
            EventDraft("mark", "mark:process-gave-up", {"mark": {"type": "process-gave-up",
                                                                 "name": "x"}}),
            EventDraft("effect", "n-1", {"effect": {"type": "other"}}, origin="engine:tick")])
        book = LogBook(store)
        await book.catch_up(frozenset({"restart-process", "process-gave-up"}))
        assert [(d["kind"], d["type"]) for d in book.survival] == [
            ("effect", "restart-process"), ("mark", "process-gave-up")]
    finally:
        await store.close()


async def test_the_effects_list_refuses_a_state_that_does_not_exist(tmp_path: Path) -> None:
    from pulse_core import Engine
    from tests.web.test_rules_api import ui_of

    engine = Engine(tmp_path / "home")
    await engine.open()
    try:
        async with ui_of(engine, has_directory=False) as http:
            bad = await http.get("/api/effects", params={"status": "nope"})
            good = await http.get("/api/effects", params={"status": "cancelled"})
    finally:
        await engine.close()
    assert bad.status_code == 400 and "cancelled" in bad.json()["error"]
    assert good.status_code == 200 and good.json()["effects"] == []


async def test_an_acked_effect_shows_no_error_and_took_its_last_attempts_time(
        tmp_path: Path) -> None:
    """Issue 26, item 8: an acked effect kept showing its first attempt's error, and its
    "took" ran from its creation, a retry's wait included."""
    from pulse_adapters.web._views import effects
    from pulse_core import ManualClock

    clock = ManualClock()
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    try:
        key = "e-1"
        steps: list[tuple[int, EventDraft]] = [
            (0, EventDraft("effect", key, {"effect": {"type": "ping"}, "dedup": key})),
            (1_000, EventDraft("effect-executing", key, {"attempt": 1, "owner": "t"})),
            (2_000, EventDraft("effect-failed", key, {"attempt": 1, "error": "boom"})),
            (60_000, EventDraft("effect-executing", key, {"attempt": 2, "owner": "t"})),
            (500, EventDraft("effect-acked", key, {"attempt": 2, "result": "ok"})),
            (0, EventDraft("effect", "e-2", {"effect": {"type": "ping"}, "dedup": "e-2"})),
            (0, EventDraft("effect-cancelled", "e-2", {"reason": "not needed", "was": "pending"})),
        ]
        for wait_ms, draft in steps:
            clock.advance(wait_ms)
            await store.append([draft])
        book = LogBook(store)
        await book.catch_up()
        shown = {e["id"]: e for e in effects(book, None, 10)}
    finally:
        await store.close()
    acked = shown["e-1"]
    assert acked["status"] == "acked" and acked["error"] is None
    assert acked["earlier_error"] == "boom"
    assert acked["duration_ms"] == 500
    assert acked["attempt_started_at"] == acked["updated_at"] - 500
    assert shown["e-2"]["status"] == "cancelled" and shown["e-2"]["duration_ms"] is None
