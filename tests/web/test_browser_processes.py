"""The survival layer's Processes page in a real headless browser against a real daemon: the
operator's stop, start, restart and reset buttons (only those that make sense in the
process's state) each write a `process-requested` event through the UI's guard, which the
daemon's survival layer acts on; and the log view shows the end of a process's output."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest
from playwright.sync_api import Locator, Page

from tests.web.conftest import ESSENTIAL, LIVE_S, WebDaemon, wait_for

pytestmark = pytest.mark.slow
TEST_TIME_LIMIT_S = 120
Shoot = Callable[[Page, str], Path]


def open_processes(page: Page, web: WebDaemon) -> Locator:
    page.goto(web.opener("processes"))
    row = page.locator(f'#processes tr[data-key="{ESSENTIAL}"]')
    wait_for(lambda: row.count() == 1 and row.locator(".state").inner_text() == "RUNNING",
             30, "the essential process's row to say RUNNING")
    return row


def buttons(row: Locator) -> list[str]:
    return row.locator("button[data-action]").all_inner_texts()


def state_is(row: Locator, state: str) -> Callable[[], bool]:
    return lambda: row.locator(".state").inner_text() == state


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_stop_keeps_it_stopped_and_start_brings_it_back_from_the_page(
        page: Page, daemon: WebDaemon, screenshot: Shoot) -> None:
    row = open_processes(page, daemon)
    assert buttons(row) == ["Stop", "Restart"]  # RUNNING: no Start, no Reset
    running = daemon.essential_pid()
    before = len(daemon.events("process-requested"))
    row.locator('button[data-action="stop"]').click()
    wait_for(state_is(row, "STOPPED"), 30, "the row to say STOPPED")
    assert not alive(running)
    assert buttons(row) == ["Start"]
    assert "stopped by an operator" in row.inner_text()
    (asked,) = daemon.events("process-requested")[before:]
    assert (asked["data"]["action"], asked["data"]["name"], asked["origin"]) == \
        ("stop", ESSENTIAL, "human:web")
    assert "asked (event #" in page.locator("#asked").inner_text()
    screenshot(page, "processes-stopped")

    row.locator("button.process-log").click()
    shown = page.locator("#log-lines")
    wait_for(lambda: "does not exist yet" in shown.inner_text(), LIVE_S,
             "the log view to say pulse has not written the log")

    row.locator('button[data-action="start"]').click()
    wait_for(state_is(row, "RUNNING"), 30, "the row to say RUNNING again")
    started = daemon.essential_pid()
    assert started != running and alive(started)
    assert [e["data"]["action"] for e in daemon.events("process-requested")[before:]] == [
        "stop", "start"]
    log = daemon.home / "logs" / f"{ESSENTIAL}.log"
    wait_for(log.exists, LIVE_S, "pulse to open the process's log")
    with log.open("a") as out:
        out.write("first line\nsecond line\n")
    wait_for(lambda: shown.inner_text() == "first line\nsecond line", LIVE_S,
             "the log view to show the log's lines")
    assert page.locator("#log-path").inner_text() == str(log)
    screenshot(page, "processes-log")


def test_restart_from_the_page_replaces_the_process(page: Page, daemon: WebDaemon) -> None:
    row = open_processes(page, daemon)
    before = daemon.essential_pid()
    asked = len(daemon.events("process-requested"))
    row.locator('button[data-action="restart"]').click()
    wait_for(lambda: daemon.essential_pid() != before, 30, "a new pid in the pidfile")
    wait_for(state_is(row, "RUNNING"), 30, "the row to say RUNNING")
    assert not alive(before) and alive(daemon.essential_pid())
    assert [e["data"]["action"] for e in daemon.events("process-requested")[asked:]] == [
        "restart"]


def test_a_control_is_guarded_and_a_senseless_one_is_refused_with_the_reason(
        daemon: WebDaemon) -> None:
    url = daemon.url + "api/pages/processes/"
    wait_for(lambda: daemon.process_state() == "RUNNING", 30, "the process to be RUNNING")
    before = daemon.events("process-requested")
    assert httpx.post(url + "stop", json={"name": ESSENTIAL}, timeout=10).status_code == 401
    unknown = httpx.post(url + "start", json={"name": "nope"}, headers=daemon.bearer(),
                         timeout=10)
    assert unknown.status_code == 404
    assert f"no essential process named 'nope': known: {ESSENTIAL}" in unknown.json()["error"]
    reset = httpx.post(url + "reset", json={"name": ESSENTIAL}, headers=daemon.bearer(),
                       timeout=10)
    assert reset.status_code == 400
    assert f"{ESSENTIAL} is RUNNING, not FATAL" in reset.json()["error"]
    assert daemon.events("process-requested") == before  # nothing refused was asked
