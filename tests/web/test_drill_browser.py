"""The drill-down and the fleet page in a real headless browser (Debian's chromium, driven by
Playwright): two engines in processes of their own write the log the UI's process reads; a
count clicked opens exactly the events it is made of, an event's cause clicked opens that
event in its key's history, and the fleet page shows both engines live."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page

from pulse_core import Event, SqliteEventStore
from pulse_core._effects import effect_draft
from tests.fleet.fleet_support import host_processes, ready
from tests.web.conftest import ELSEWHERE, LIVE_S, OrphanEffect, UiProcess, run_async, wait_for

pytestmark = pytest.mark.slow
TEST_TIME_LIMIT_S = 90
Shoot = Callable[[Page, str], Path]


class Drill:
    """The UI's process on a home whose log two engine processes (red, blue) share, with
    effects two of which are failed for good (no host runs their type), three pending for
    another host, and `caused`, failed too, whose cause is an engine-started event."""

    def __init__(self, ui: UiProcess, caused: Event, cause: Event) -> None:
        self.ui, self.caused, self.cause = ui, caused, cause

    def open(self, page: Page, path: str) -> None:
        page.goto(f"{self.ui.url}{path}{'&' if '?' in path else '?'}token={self.ui.token}")
        assert "token" not in page.url


@pytest.fixture(scope="module")
def drill(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drill]:
    root = tmp_path_factory.mktemp("drill")
    ui = UiProcess(root / "home", {"port": 0, "live_every_s": 0.2})
    ui.start()
    with host_processes(root) as start:
        url = f"sqlite://{root / 'home' / 'events.db'}"
        hosts = [start(name, url, "--heartbeat-seconds", "1") for name in ("red", "blue")]
        run_async(lambda: ready(*hosts))
        caused, cause = run_async(lambda: append_effects(root / "home" / "events.db"))
        try:
            yield Drill(ui, caused, cause)
        finally:
            ui.stop()
            for host in hosts:
                host.kill()


async def append_effects(path: Path) -> tuple[Event, Event]:
    events = await SqliteEventStore.open(path)
    try:
        cause = (await events.read(kinds=["engine-started"]))[-1]
        await events.append([effect_draft(OrphanEffect(note=f"lost {n}"), "agent")
                             for n in range(2)])
        await events.append([effect_draft(OrphanEffect(note=f"held {n}"), "agent",
                                          host=ELSEWHERE) for n in range(3)])
        caused = (await events.append([effect_draft(OrphanEffect(note="why"), "agent",
                                                    cause=cause.seq)])).events[0]
        for _ in range(600):
            if len(await events.read(kinds=["effect-failed"])) >= 3:
                return caused, cause
            await asyncio.sleep(0.05)
        raise AssertionError("the engines did not fail the effects no host runs")
    finally:
        await events.close()


def rows(page: Page) -> int:
    return page.locator("#events tbody tr[data-seq]").count()


def card_value(page: Page, selector: str) -> int | None:
    text = page.locator(selector).inner_text().strip()
    return int(text) if text.isdigit() else None


def click_count(page: Page, card: str, expected: int) -> None:
    """Wait for `card` to show `expected`, click it, and wait for as many rows of events."""
    wait_for(lambda: card_value(page, f"{card} .value") == expected, LIVE_S, f"{card}'s count")
    page.locator(card).click()
    page.wait_for_url("**/events?effects=*")
    wait_for(lambda: rows(page) == expected, LIVE_S, f"{expected} rows of events from {card}")
    assert page.locator("#count").inner_text().startswith(f"{expected} events shown")


def test_a_count_clicked_opens_exactly_the_events_it_is_made_of(
        page: Page, drill: Drill, screenshot: Shoot) -> None:
    for card, expected in (("#card-failed", 3), ("#card-pending", 3)):
        drill.open(page, "")
        click_count(page, card, expected)
        screenshot(page, card.strip("#"))
    drill.open(page, "effects")
    click_count(page, "#count-failed", 3)
    assert page.url.endswith("/events?effects=failed")


def test_an_events_cause_clicked_opens_it_in_its_keys_history(
        page: Page, drill: Drill, screenshot: Shoot) -> None:
    key = drill.caused.key
    drill.open(page, "events?effects=failed")
    link = page.locator(f'#events a.history:text-is("{key}")')
    wait_for(lambda: link.count() == 1, LIVE_S, "the effect's row on the events page")
    link.click()
    page.wait_for_url(f"**/history?key={key}*")
    row = page.locator(f'#history tr[data-seq="{drill.caused.seq}"]')
    wait_for(lambda: row.count() == 1, LIVE_S, "the effect's own event in its history")
    # the failure leads back to its effect, the effect to the event an agent named its cause
    outcome = page.locator("#history tbody tr").last
    outcome.locator(f'a.history:has-text("#{drill.caused.seq} effect")').click()
    page.wait_for_url(f"**/history?key={key}&seq={drill.caused.seq}")
    wait_for(lambda: "here" in (row.get_attribute("class") or ""), LIVE_S,
             "the effect's event marked as the one landed on")
    row.locator(f'a.history:has-text("#{drill.cause.seq} engine-started")').click()
    page.wait_for_url(f"**/history?key=engine&seq={drill.cause.seq}")
    landed = page.locator(f'#history tr.here[data-seq="{drill.cause.seq}"]')
    wait_for(lambda: landed.count() == 1, LIVE_S, "the cause marked in the engine's history")
    assert "engine-started" in landed.inner_text()
    screenshot(page, "history")


def test_the_fleet_page_shows_both_engines_live(
        page: Page, drill: Drill, screenshot: Shoot) -> None:
    drill.open(page, "fleet")
    for host in ("red", "blue"):
        row = page.locator("#engines tbody tr", has_text=f"{host}:").filter(has_text="LIVE")
        wait_for(row.count, LIVE_S, f"engine {host} live on the fleet page")
        assert row.count() == 1 and "heartbeat" in row.inner_text()
    assert page.locator('#nav a[href="/fleet"]').count() == 1
    screenshot(page, "fleet")
