"""The web UI in a real headless browser (Debian's chromium, driven by Playwright) against a
real daemon: every page opens with the token and shows what matters, new data appears without
a reload, and the operator's controls write their events. A screenshot of each page is kept
under test-artifacts/web/.

The tests share one daemon; the rollback, which reloads it, comes last."""

from __future__ import annotations

import json
import os
import re
import signal
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Locator, Page, Request

from tests.web.conftest import (
    CODER,
    ELSEWHERE,
    ESSENTIAL,
    LIVE_S,
    OrphanEffect,
    WebDaemon,
    wait_for,
)

pytestmark = pytest.mark.slow
TEST_TIME_LIMIT_S = 90
Shoot = Callable[[Page, str], Path]
SVG = "{http://www.w3.org/2000/svg}"


def open_ui(page: Page, web: WebDaemon, path: str = "") -> None:
    """Open page `path` as a user does: the address `upulse ui` prints (with the token),
    which sets the cookie and shows the page at an address without the token."""
    page.goto(web.opener(path))
    assert "token" not in page.url, f"the token stayed in the address bar: {page.url}"
    assert urlsplit(page.url).path == "/" + path.partition("?")[0], page.url
    assert not page.locator("#problem").is_visible()
    page.evaluate("window.pulseTestMark = 'no reload since'")


def not_reloaded(page: Page) -> bool:
    """True while the page is the one `open_ui` opened (it was not loaded again)."""
    return bool(page.evaluate("window.pulseTestMark === 'no reload since'"))


def waited(page: Page, probe: Callable[[], Any], timeout: float, what: str) -> Any:
    """`wait_for`, failing at once (with what it says) when the page shows a problem."""
    shown = page.locator("#problem")

    def probing() -> Any:
        if shown.count() and shown.is_visible():
            raise AssertionError(f"waiting for {what}, the page said: {shown.inner_text()}")
        return probe()

    return wait_for(probing, timeout, what)


def cells(row: Locator) -> list[str]:
    return [text.strip() for text in row.locator("td").all_inner_texts()]


def number_in(page: Page, selector: str) -> float | None:
    """The number a card shows (None while it shows none)."""
    text = page.locator(selector).inner_text().strip()
    return float(text) if re.fullmatch(r"-?\d+(\.\d+)?", text) else None


# -- Overview --------------------------------------------------------------------------------

def test_overview_counts_ticks_live(page: Page, daemon: WebDaemon, screenshot: Shoot) -> None:
    open_ui(page, daemon)
    first = wait_for(lambda: number_in(page, "#card-ticks .value"), LIVE_S, "a tick count")
    assert first > 0
    wait_for(lambda: (number_in(page, "#card-ticks .value") or 0) > first, LIVE_S,
             "the tick count to move")
    assert page.locator("#card-revision .value").inner_text() != "none"
    # the cursor layer's program check runs once and ends: done, not a red EXITED
    check = page.locator("#loops tr", has_text="service:").filter(has_text="program")
    wait_for(lambda: check.count() == 1, LIVE_S, "the program check's loop")
    assert check.locator(".state").inner_text() == "DONE"
    assert check.locator(".state-done").count() == 1 and check.locator(".state-exited").count() == 0
    assert not_reloaded(page)
    screenshot(page, "overview")


def test_the_survival_layers_page_shows_the_essential_process_running(
        page: Page, daemon: WebDaemon, screenshot: Shoot) -> None:
    open_ui(page, daemon, "processes")
    assert page.title() == "pulse · Processes"
    nav = page.locator('#nav a[data-layer="survival"]')
    waited(page, lambda: nav.count() == 1, LIVE_S, "the survival layer's page in the nav")
    assert nav.inner_text() == "Processes" and "here" in (nav.get_attribute("class") or "")
    row = process_row(page)
    name, state, pid, *_ = cells(row)
    assert (name, state, pid) == (ESSENTIAL, "RUNNING", str(daemon.essential_pid()))
    screenshot(page, "processes")


RECORD_STATES = """() => {
    window.pulseStates = [];
    const box = document.getElementById("processes");
    const look = () => {
        const row = box.querySelector('tr[data-key="essential"]');
        const state = row && row.children[1].textContent;
        if (state && window.pulseStates.at(-1) !== state) window.pulseStates.push(state);
    };
    new MutationObserver(look).observe(box, { childList: true, subtree: true });
}"""
"""Keep every state the essential process's row shows from now on, as the page renders it."""


def process_row(page: Page) -> Locator:
    row = page.locator('#processes tr[data-key="essential"]')
    wait_for(lambda: row.count() == 1 and cells(row)[1] == "RUNNING", 30,
             "the essential process's row to say RUNNING")
    return row


def running_again(row: Locator, restarts: int, killed: int) -> Callable[[], bool]:
    """Whether `row` shows the process RUNNING under a new pid after `restarts` restarts."""
    def probe() -> bool:
        _name, state, pid, _uptime, shown, *_ = cells(row)
        return state == "RUNNING" and shown == str(restarts) and pid not in ("—", str(killed))
    return probe


def test_a_killed_essential_process_shows_starting_then_running_with_one_restart(
        page: Page, daemon: WebDaemon, screenshot: Shoot) -> None:
    open_ui(page, daemon, "processes")
    row = process_row(page)
    killed = daemon.essential_pid()
    assert daemon.first is not None and killed == daemon.first.pid, "restarted already"
    assert cells(row)[4] == "0"
    page.evaluate(RECORD_STATES)
    os.kill(killed, signal.SIGKILL)
    daemon.first.wait(timeout=10)
    wait_for(running_again(row, 1, killed), 30,
             "the row to show the process RUNNING again, restarted once")
    states: list[str] = page.evaluate("window.pulseStates")
    assert states[-1] == "RUNNING"
    assert {"BACKOFF", "STARTING"} & set(states[:-1]), f"states shown: {states}"
    assert cells(row)[2] == str(daemon.essential_pid())
    assert not_reloaded(page)
    screenshot(page, "overview-restarted")


def test_a_process_that_dies_again_while_starting_shows_backoff_then_running(
        page: Page, daemon: WebDaemon) -> None:
    """Killed, restarted, and killed again before it was up `startsecs`: a failed start, so
    the next restart waits its backoff (BACKOFF on the page), then it runs again."""
    open_ui(page, daemon, "processes")
    row = process_row(page)
    before = int(cells(row)[4])
    page.evaluate(RECORD_STATES)
    killed = daemon.essential_pid()
    os.kill(killed, signal.SIGKILL)
    restarted = wait_for(lambda: (pid := daemon.essential_pid()) != killed and pid, 30,
                         "the survival layer to restart the process")
    os.kill(restarted, signal.SIGKILL)
    wait_for(running_again(row, before + 2, restarted), 40,
             "the row to show the process RUNNING again, restarted twice more")
    states: list[str] = page.evaluate("window.pulseStates")
    assert "BACKOFF" in states, f"states shown: {states}"
    assert states[-1] == "RUNNING" and states.index("BACKOFF") < len(states) - 1
    assert not_reloaded(page)


def test_a_new_vitals_sample_appears_live_on_the_overview(page: Page, daemon: WebDaemon
                                                          ) -> None:
    open_ui(page, daemon)
    spark = page.locator('#watchers tr[data-key="system-resource"] img.spark')

    def taken() -> int | None:
        found = re.search(r"[?&]t=(\d+)", spark.get_attribute("src") or "")
        return int(found.group(1)) if found else None

    before = wait_for(taken, LIVE_S, "the system-resource watcher's latest sample")
    later = wait_for(lambda: (t := taken()) is not None and t > before and t, LIVE_S,
                     "a newer system-resource sample on the Overview")
    assert later > before
    assert not_reloaded(page)


# -- Vitals ----------------------------------------------------------------------------------

def chart_points(page: Page, chart: Locator) -> tuple[int, list[str]]:
    """The points the chart the page shows draws (its `<circle class="point">` marks, checked
    against the count on its root) and its axes' labels, from the very SVG the image loaded."""
    source = chart.get_attribute("src")
    assert source, "the chart has no source"
    response = page.context.request.get(page.url.split("/vitals")[0] + source)
    assert response.ok, response.text()
    root = ET.fromstring(response.text())
    points = [c for c in root.iter(f"{SVG}circle") if c.get("class") == "point"]
    assert len(points) == int(root.get("data-points", "-1"))
    labels = [t.text or "" for g in root.iter(f"{SVG}g") if "axis" in (g.get("class") or "")
              for t in g.iter(f"{SVG}text")]
    return len(points), labels


def test_the_vitals_page_charts_samples_with_points_and_units(
        page: Page, daemon: WebDaemon, screenshot: Shoot) -> None:
    wait_for(lambda: len(daemon.upulse.json("vitals", "system-resource", "--home", daemon.home,
                                             "--limit", "3")) >= 3,  # type: ignore[arg-type]
             10, "three system-resource samples")
    open_ui(page, daemon, "vitals?key=system-resource&window=15m")
    chart = page.locator("#chart-memory_pct")
    wait_for(lambda: chart.count() == 1 and chart.evaluate("i => i.complete && i.naturalWidth > 0"),
             LIVE_S, "the memory_pct chart to load")
    points, labels = chart_points(page, chart)
    assert points >= 2, f"{points} points"
    assert any(label.endswith("%") for label in labels), f"no percent on the axes: {labels}"
    screenshot(page, "vitals")


def test_the_vitals_page_shows_a_new_sample_live(page: Page, daemon: WebDaemon) -> None:
    open_ui(page, daemon, "vitals?key=system-resource")
    latest = page.locator("#latest")
    before = wait_for(lambda: latest.get_attribute("data-ts"), LIVE_S, "the latest sample line")
    wait_for(lambda: int(latest.get_attribute("data-ts") or 0) > int(before), LIVE_S,
             "a newer sample on the Vitals page")
    assert "latest sample" in latest.inner_text()
    assert not_reloaded(page)


# -- Events ----------------------------------------------------------------------------------

def test_a_new_event_appears_live_on_the_events_page_and_expands_to_its_data(
        page: Page, daemon: WebDaemon, screenshot: Shoot) -> None:
    open_ui(page, daemon, "events")
    wait_for(lambda: page.locator("#events tbody tr").count() > 0, LIVE_S, "the events table")
    daemon.upulse("task", "create", "web-live-1", "--title", "seen live in the browser",
                  "--home", daemon.home)
    [created] = daemon.events("task-created", key="web-live-1")
    row = page.locator(f'#events tr[data-seq="{created["seq"]}"]')
    wait_for(lambda: row.count() == 1, LIVE_S, "the new event's row")
    assert cells(row)[2:4] == ["task-created", "web-live-1"]
    assert not_reloaded(page)
    row.click()
    detail = page.locator("#events tr.detail pre.json")
    wait_for(lambda: detail.count() == 1, LIVE_S, "the event's data")
    assert '"title": "seen live in the browser"' in detail.inner_text()
    screenshot(page, "events")


# -- Effects ---------------------------------------------------------------------------------

def answer_prompt(page: Page, answer: str, asked: list[str]) -> None:
    """Answer the next dialog the page opens with `answer` (keeping what it asked)."""
    def accept(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept(answer)
    page.once("dialog", accept)


def test_the_effects_page_cancels_a_pending_effect_and_retries_a_failed_one(
        page: Page, daemon: WebDaemon, screenshot: Shoot) -> None:
    pending = daemon.append_effect(OrphanEffect(note="held for another host"), host=ELSEWHERE)
    failed = daemon.append_effect(OrphanEffect(note="no executor runs it"))
    wait_for(lambda: daemon.events("effect-failed", key=failed), 15,
             "the daemon to fail the effect no executor handles")
    open_ui(page, daemon, "effects")
    pending_row = page.locator(f'#effects tr[data-key="{pending}"]')
    failed_row = page.locator(f'#effects tr[data-key="{failed}"]')
    wait_for(lambda: pending_row.count() == 1 and failed_row.count() == 1, LIVE_S,
             "both effects on the page")
    assert cells(pending_row)[2] == "pending" and cells(failed_row)[2] == "failed"
    screenshot(page, "effects")

    asked: list[str] = []
    answer_prompt(page, "cancelled from the browser", asked)
    pending_row.locator("button.cancel").click()
    [cancelled] = waited(page, lambda: daemon.events("effect-cancelled", key=pending), LIVE_S,
                         "the effect-cancelled event")
    assert pending in asked[0]
    assert cancelled["origin"] == "human:web"
    assert cancelled["data"]["reason"] == "cancelled from the browser"
    wait_for(lambda: cells(pending_row)[2] == "cancelled", LIVE_S, "the row to say cancelled")

    answer_prompt(page, "retried from the browser", asked)
    failed_row.locator("button.retry").click()
    [retried] = waited(page, lambda: daemon.events("effect-retried", key=failed), LIVE_S,
                       "the effect-retried event")
    assert failed in asked[1]
    assert retried["origin"] == "human:web"
    assert retried["data"]["reason"] == "retried from the browser"
    assert not page.locator("#problem").is_visible()
    screenshot(page, "effects-controlled")


# -- Reviewer and Memory ---------------------------------------------------------------------

def test_the_reviewer_page_renders(page: Page, daemon: WebDaemon, screenshot: Shoot) -> None:
    open_ui(page, daemon, "reviewer")
    assert page.title() == "pulse · Reviewer"
    mode = page.locator("#card-mode .value")
    waited(page, lambda: mode.count() == 1 and page.locator("#cycles table").count() == 1,
           LIVE_S, "the reviewer's cards and cycles")
    assert mode.inner_text() == "full"
    assert page.locator('#nav a[data-layer="awareness"]').inner_text() == "Reviewer"
    assert not page.locator("#problem").is_visible()
    screenshot(page, "reviewer")


def on_demand_ending(daemon: WebDaemon) -> dict[str, Any] | None:
    """The event that ended the daemon's first on-demand maintenance cycle (None before)."""
    began = [event for event in daemon.events("maintenance-cycle-began")
             if event["data"].get("trigger") == "on-demand"]
    if not began:
        return None
    key = f"activity:{began[0]['data']['cycle']}"
    ended = daemon.events("activity-completed", "activity-failed", "activity-cancelled",
                          key=key)
    return ended[0] if ended else None


def test_the_maintenance_page_renders_from_its_view_alone(
        page: Page, daemon: WebDaemon, screenshot: Shoot) -> None:
    daemon.request_maintenance("asked by the browser test")
    # The daemon's part first (its next tick, then the cycle), so that a failure says which
    # part did not happen: the cycle ending, or the page showing how it ended.
    ended = wait_for(lambda: on_demand_ending(daemon), 60,
                     "the daemon to begin and end the cycle asked for")
    assert ended["kind"] == "activity-completed", ended
    open_ui(page, daemon, "maintenance")
    waited(page, lambda: page.title() == "pulse · Maintenance", LIVE_S, "the page's title")
    row = page.locator('[data-field="cycles"] tr').nth(1)
    waited(page, lambda: row.count() == 1 and "completed" in cells(row), LIVE_S,
           "the completed cycle in the cycles table")
    began = page.locator('[data-field="cycles_began"] .value')
    assert int(began.inner_text()) >= 1
    assert page.locator('[data-field="last_report"] [data-field="health"] table').count() == 1
    assert page.locator('#nav a[data-layer="maintenance"]').inner_text() == "Maintenance"
    assert not page.locator("#problem").is_visible()
    screenshot(page, "maintenance")


def test_the_agent_runs_page_of_a_host_layer_renders(
        page: Page, daemon: WebDaemon, screenshot: Shoot) -> None:
    open_ui(page, daemon, "cursor-runs")
    waited(page, lambda: page.title() == "pulse · Cursor runs", LIVE_S, "the page's title")
    row = page.locator(f'[data-field="agents"] tr[data-key="{CODER}"]')
    waited(page, lambda: row.count() == 1, LIVE_S, "the cursor agent's row")
    assert cells(row) == [CODER, "0", "0", "0", "0", "0"]
    assert page.locator('#nav a[data-layer="cursor"]').inner_text() == "Cursor runs"
    assert page.locator("#page-problems").count() == 0  # every layer built in the UI
    assert not page.locator("#problem").is_visible()
    screenshot(page, "cursor-runs")


def test_the_memory_page_shows_an_identity_and_its_exchange(
        page: Page, daemon: WebDaemon, screenshot: Shoot) -> None:
    daemon.upulse("memory", "exchange", "ada", "the browser test says hello", "--home",
                  daemon.home)
    open_ui(page, daemon, "memory")
    identity = page.locator('#identities tr[data-key="ada"]')
    waited(page, lambda: identity.count() == 1, LIVE_S, "the identity on the Memory page")
    identity.click()
    exchange = page.locator("#exchanges td", has_text="the browser test says hello")
    waited(page, lambda: exchange.count() == 1, LIVE_S, "the exchange among ada's records")
    assert page.locator("#records-title").inner_text().startswith("ada")
    assert not page.locator("#problem").is_visible()
    screenshot(page, "memory")


# -- Rule chain (last: a rollback reloads the daemon) ----------------------------------------

def test_the_rule_chain_rollback_asks_first_and_then_its_event_appears(
        page: Page, daemon: WebDaemon, screenshot: Shoot) -> None:
    open_ui(page, daemon, "rules")
    assert page.locator("h1").inner_text() == "Rule chain"
    wait_for(lambda: page.locator("main table").count() > 0, LIVE_S, "the rule chain's tables")
    screenshot(page, "rules")
    posts: list[str] = []

    def seen(request: Request) -> None:
        if request.method == "POST":
            posts.append(request.url)

    page.on("request", seen)
    button = page.get_by_role("button", name=re.compile("roll ?back", re.IGNORECASE)).first
    asked: list[str] = []

    def dismiss(dialog: Any) -> None:
        asked.append(dialog.type)
        dialog.dismiss()

    page.once("dialog", dismiss)
    button.click()
    wait_for(lambda: asked, LIVE_S, "the rollback to ask first")
    page.wait_for_timeout(500)  # what a dismissed dialog would have sent by now
    assert posts == [], f"a dismissed rollback sent {posts}"
    assert rollback_effects(daemon) == [] and daemon.events("rollback") == []

    ui_pid = serving_pid(daemon)
    assert ui_pid is not None
    page.evaluate("""() => {
        window.pulseLive = [];
        const dot = document.getElementById("live");
        new MutationObserver(() => window.pulseLive.push(dot.className))
            .observe(dot, { attributes: true, attributeFilter: ["class"] });
    }""")
    answer_prompt(page, "rolled back from the browser", asked)
    button.click()
    [rollback] = waited(page, lambda: daemon.events("rollback"), 30, "the rollback event")
    assert rollback["data"]["reason"] == "rolled back from the browser"
    assert [url for url in posts if url.endswith("/api/rollback")] == posts and len(posts) == 1
    [effect] = rollback_effects(daemon)
    assert effect["origin"] == "human:web"
    # The daemon reloads, and its UI's process with it; the page reconnects on its own and
    # shows the revision the daemon runs now.
    wait_for(lambda: serving_pid(daemon) not in (None, ui_pid), 30,
             "the reloaded daemon's UI to serve")
    revision = page.locator("#card-revision .value")
    waited(page, lambda: revision.inner_text() == rollback["data"]["revision"][:12], 30,
           "the page to show the revision rolled back to")
    live: list[str] = page.evaluate("window.pulseLive")
    assert "live off" in live and live[-1] == "live on", f"the stream's states: {live}"
    assert not_reloaded(page)
    # main has the last good revision's files now: the button is no longer offered
    last_good = page.get_by_role("button", name="Roll back to the last known good revision")
    waited(page, last_good.is_disabled, LIVE_S, "the last-good rollback to be withdrawn")
    assert page.locator("#last-good-why").inner_text().startswith(
        "main already has the files of")
    screenshot(page, "rules-rolled-back")


def serving_pid(web: WebDaemon) -> int | None:
    """The pid of the UI's process in HOME/web.json (None while none serves)."""
    try:
        return int(json.loads((web.home / "web.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def rollback_effects(web: WebDaemon) -> list[dict[str, Any]]:
    """The log's Rollback effects."""
    return [e for e in web.events("effect") if e["data"]["effect"]["type"] == "rollback"]
