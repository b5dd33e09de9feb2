"""The guard of a real daemon's web UI, over HTTP: every page, static file, API call, live
stream, control and /metrics is refused without the right token, with a forged Host or from
another site, and served with the token; the token stays out of the address bar and the
logs, and its file is the owner's only."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.web.conftest import ELSEWHERE, OrphanEffect, WebDaemon

WRONG = "w" * 43
TARGETS = {
    "page": ("GET", "/events"),
    "static file": ("GET", "/static/app.js"),
    "JSON API": ("GET", "/api/overview"),
    "event stream": ("GET", "/stream/events"),
    "control": ("POST", "/api/effects/{pending}/cancel"),
    "metrics": ("GET", "/metrics"),
}
SERVED_AS = {
    "page": "text/html",
    "static file": "javascript",
    "JSON API": "application/json",
    "event stream": "text/event-stream",
    "control": "application/json",
    "metrics": "text/plain",
}
Request = dict[str, dict[str, str]]
"""What a case sends besides the method and path: `headers` and `params`."""


def cookie_name(web: WebDaemon) -> str:
    return f"pulse_ui_{urlsplit(web.url).port}"


def origin(web: WebDaemon) -> str:
    return web.url.rstrip("/")


def cookie(web: WebDaemon, value: str) -> dict[str, str]:
    """The header of a browser that holds the UI's cookie with `value`."""
    return {"cookie": f"{cookie_name(web)}={value}"}


REFUSALS: dict[str, tuple[int, Callable[[WebDaemon], Request]]] = {
    "no token": (401, lambda web: {}),
    "a wrong bearer token": (401, lambda web: {"headers": {"authorization": f"Bearer {WRONG}"}}),
    "a wrong cookie": (401, lambda web: {"headers": cookie(web, WRONG)}),
    "a wrong token in the address": (401, lambda web: {"params": {"token": WRONG}}),
    "a forged Host": (421, lambda web: {"headers": {**web.bearer(),
                                                    "host": "pulse.attacker.example"}}),
    "a Host on another port": (421, lambda web: {"headers": {**web.bearer(),
                                                             "host": "127.0.0.1:1"}}),
    "an Origin of another site": (403, lambda web: {"headers": {
        **web.bearer(), "origin": "http://attacker.example"}}),
    "Sec-Fetch-Site cross-site": (403, lambda web: {"headers": {
        **web.bearer(), "sec-fetch-site": "cross-site"}}),
    "Sec-Fetch-Site same-site": (403, lambda web: {"headers": {
        **web.bearer(), "sec-fetch-site": "same-site"}}),
}


@pytest.fixture(scope="module")
def http(daemon: WebDaemon) -> Iterator[httpx.Client]:
    """A client of the UI that follows no redirect and keeps no cookie between requests."""
    with httpx.Client(base_url=daemon.url, follow_redirects=False, timeout=10) as client:
        yield client


def pending_effect(web: WebDaemon) -> str:
    """A new effect that stays pending in this daemon (bound to another host)."""
    return web.append_effect(OrphanEffect(note="held for another host"), host=ELSEWHERE)


def send(http: httpx.Client, target: str, request: Request, pending: str
         ) -> tuple[httpx.Response, str]:
    """Send `request` to `target`; the response (a stream's status and first line only)
    and the text read."""
    method, path = TARGETS[target]
    http.cookies.clear()
    with http.stream(method, path.format(pending=pending), headers=request.get("headers"),
                     params=request.get("params")) as response:
        if target == "event stream" and response.status_code == 200:
            return response, next(response.iter_lines())
        return response, response.read().decode()


def status_of(http: httpx.Client, web: WebDaemon, effect_id: str) -> str:
    found = http.get("/api/effects", headers=web.bearer()).json()["effects"]
    return next(str(e["status"]) for e in found if e["id"] == effect_id)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", REFUSALS)
def test_a_request_without_the_right_token_or_from_elsewhere_is_refused(
        daemon: WebDaemon, http: httpx.Client, target: str, case: str) -> None:
    status, build = REFUSALS[case]
    pending = pending_effect(daemon) if target == "control" else "none"
    response, text = send(http, target, build(daemon), pending)
    assert response.status_code == status, f"{case} → {target}: {response.status_code} {text}"
    assert "set-cookie" not in response.headers
    assert response.headers["content-security-policy"].startswith("default-src 'self'")
    assert "refused" in text or "needs its token" in text, text
    if target == "control":
        assert status_of(http, daemon, pending) == "pending", "a refused control wrote"


def test_a_post_with_the_token_in_its_address_is_refused(daemon: WebDaemon,
                                                         http: httpx.Client) -> None:
    """The token in an address opens pages (GET); it never authorises a change."""
    pending = pending_effect(daemon)
    response = http.post(f"/api/effects/{pending}/cancel", params={"token": daemon.token})
    assert response.status_code == 401
    assert status_of(http, daemon, pending) == "pending"


@pytest.mark.parametrize("target", TARGETS)
def test_the_right_bearer_token_is_served(daemon: WebDaemon, http: httpx.Client,
                                          target: str) -> None:
    pending = pending_effect(daemon) if target == "control" else "none"
    response, text = send(http, target, {"headers": daemon.bearer()}, pending)
    assert response.status_code == 200, f"{target}: {response.status_code} {text}"
    assert SERVED_AS[target] in response.headers["content-type"]
    assert response.headers["x-frame-options"] == "DENY"
    if target == "event stream":
        assert text.startswith("retry:")
    if target == "control":
        assert status_of(http, daemon, pending) == "cancelled"


@pytest.mark.parametrize("target", TARGETS)
def test_the_cookie_from_the_address_with_the_token_is_served(
        daemon: WebDaemon, http: httpx.Client, target: str) -> None:
    """What a browser does: open /?token=..., then send the cookie it was given (and, for a
    change, its own Origin)."""
    http.cookies.clear()
    welcome = http.get("/", params={"token": daemon.token})
    given = cookie(daemon, welcome.cookies[cookie_name(daemon)])
    pending = pending_effect(daemon) if target == "control" else "none"
    headers = {**given, "origin": origin(daemon)} if target == "control" else given
    response, text = send(http, target, {"headers": headers}, pending)
    assert response.status_code == 200, f"{target}: {response.status_code} {text}"
    assert SERVED_AS[target] in response.headers["content-type"]


def test_a_change_with_the_cookie_but_without_an_origin_is_refused(
        daemon: WebDaemon, http: httpx.Client) -> None:
    """A control sent with the cookie must say it comes from the UI's own pages."""
    pending = pending_effect(daemon)
    http.cookies.clear()
    session = http.get("/", params={"token": daemon.token}).cookies[cookie_name(daemon)]
    http.cookies.clear()
    response = http.post(f"/api/effects/{pending}/cancel", headers=cookie(daemon, session))
    assert response.status_code == 403
    assert "from the UI's own pages" in response.text
    assert status_of(http, daemon, pending) == "pending"
    allowed = http.post(f"/api/effects/{pending}/cancel",
                        headers={**cookie(daemon, session), "origin": origin(daemon)})
    assert allowed.status_code == 200, allowed.text
    assert allowed.json()["kind"] == "effect-cancelled"


def test_the_address_with_the_token_sets_a_strict_cookie_and_drops_the_token(
        daemon: WebDaemon, http: httpx.Client) -> None:
    http.cookies.clear()
    response = http.get("/events", params={"kind": "task-created", "token": daemon.token})
    assert response.status_code == 303
    assert response.headers["location"] == "/events?kind=task-created"
    set_cookie = response.headers["set-cookie"]
    attributes = {part.strip().lower() for part in set_cookie.split(";")}
    assert set_cookie.startswith(f"{cookie_name(daemon)}=")
    assert daemon.token not in set_cookie  # other local servers see a localhost cookie
    session = response.cookies[cookie_name(daemon)]
    refused = http.get("/api/overview", headers={"authorization": f"Bearer {session}"})
    assert refused.status_code == 401
    assert "httponly" in attributes
    assert "samesite=strict" in attributes
    assert "path=/" in attributes
    http.cookies.clear()
    page = http.get(response.headers["location"],
                    headers=cookie(daemon, response.cookies[cookie_name(daemon)]))
    assert page.status_code == 200
    assert "<title>pulse" in page.text


def test_the_token_files_are_the_owners_only(daemon: WebDaemon) -> None:
    for name in ("ui.token", "web.json"):
        mode = stat.S_IMODE((daemon.home / name).stat().st_mode)
        assert mode == 0o600, f"{name} is {oct(mode)}"
    assert (daemon.home / "ui.token").read_text().strip() == daemon.token


def test_the_token_never_reaches_the_daemons_logs(daemon: WebDaemon,
                                                  http: httpx.Client) -> None:
    http.cookies.clear()
    http.get("/", params={"token": daemon.token})
    http.get("/api/events", params={"token": daemon.token})
    http.get("/api/overview", headers=daemon.bearer())
    http.get("/nothing-here", headers=daemon.bearer())
    logs = [daemon.home / "daemon.log", *sorted((daemon.home / "logs").glob("*"))]
    assert (daemon.home / "daemon.log").stat().st_size > 0
    for log in logs:
        assert daemon.token not in log.read_text(errors="replace"), f"the token is in {log}"


def test_daemon_status_names_where_the_ui_serves_but_never_its_token(daemon: WebDaemon
                                                                      ) -> None:
    shown = daemon.upulse("daemon", "status", "--home", daemon.home)
    (line,) = [row for row in shown.stdout.splitlines() if row.startswith("web UI")]
    assert daemon.url in line
    assert daemon.token not in shown.stdout + shown.stderr
    report = json.loads(daemon.upulse("daemon", "status", "--json", "--home",
                                      daemon.home).stdout)
    assert report["web_ui"] == daemon.url
