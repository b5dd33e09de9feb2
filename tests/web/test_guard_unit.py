"""The Guard in front of the web UI, on a bare app: Host, cross-site, then the token."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from pulse_adapters.web import Guard, allowed_hosts

TOKEN = "t" * 43
PORT = 8421
COOKIE = f"pulse_ui_{PORT}"
SESSION = hmac.new(TOKEN.encode(), b"pulse-ui-cookie", hashlib.sha256).hexdigest()


async def echo(request: Request) -> PlainTextResponse:
    return PlainTextResponse(f"{request.method} {request.url.path}?{request.url.query}")


def guarded() -> Guard:
    app = Starlette(routes=[Route("/{path:path}", echo, methods=["GET", "POST"])])
    return Guard(app, token=TOKEN, hosts=allowed_hosts(PORT), cookie=COOKIE)


class Client:
    """Requests through the Guard, in process; `cookie` sends the UI's cookie."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def request(self, method: str, path: str, *, headers: dict[str, str] | None = None,
                      cookie: str | None = None) -> httpx.Response:
        headers = dict(headers or {})
        if cookie is not None:
            headers["cookie"] = cookie
        return await self.http.request(method, path, headers=headers)

    async def get(self, path: str, **options: Any) -> httpx.Response:
        return await self.request("GET", path, **options)

    async def post(self, path: str, **options: Any) -> httpx.Response:
        return await self.request("POST", path, **options)


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    transport = httpx.ASGITransport(app=guarded())
    async with httpx.AsyncClient(transport=transport, base_url=f"http://127.0.0.1:{PORT}",
                                 follow_redirects=False) as http:
        yield Client(http)


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_the_right_token_is_served_with_security_headers(client: Client) -> None:
    response = await client.get("/api/x", headers=bearer())
    assert response.status_code == 200
    assert response.text == "GET /api/x?"
    assert "default-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["cache-control"] == "no-store"


@pytest.mark.parametrize("token", ["", "t" * 42, "t" * 44, "T" * 43, "t" * 42 + "u"])
async def test_a_wrong_or_missing_token_is_refused(client: Client, token: str) -> None:
    response = await client.get("/api/x", headers=bearer(token) if token else {})
    assert response.status_code == 401
    assert "upulse ui" in response.text
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert "content-security-policy" in response.headers


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8421", "127.0.0.1:8422",
                                  "127.0.0.1", "localhost:80", ""])
async def test_a_host_the_ui_does_not_answer_to_is_refused_even_with_the_token(
        client: Client, host: str) -> None:
    response = await client.get("/api/x", headers={**bearer(), "host": host})
    assert response.status_code == 421


@pytest.mark.parametrize("host", ["127.0.0.1:8421", "localhost:8421", "[::1]:8421",
                                  "LOCALHOST:8421"])
async def test_the_loopback_names_on_its_port_are_answered(client: Client, host: str) -> None:
    assert (await client.get("/api/x", headers={**bearer(), "host": host})).status_code == 200


def test_allowed_hosts_adds_names_and_port_80_allows_bare_names() -> None:
    assert "pulse.lan:443" in allowed_hosts(8421, ("pulse.lan:443",))
    assert "localhost" in allowed_hosts(80)
    assert "localhost" not in allowed_hosts(8421)
    assert "192.0.2.2:8421" in allowed_hosts(8421, bound="192.0.2.2")
    assert "[fd00::2]:8421" in allowed_hosts(8421, bound="fd00::2")
    assert not any(h.startswith("0.0.0.0") for h in allowed_hosts(8421, bound="0.0.0.0"))


@pytest.mark.parametrize("headers", [
    {"sec-fetch-site": "cross-site"},
    {"sec-fetch-site": "same-site"},
    {"origin": "http://evil.example"},
    {"origin": "http://127.0.0.1:9999"},
    {"origin": "null"},
])
async def test_a_request_from_another_site_is_refused_even_with_the_token(
        client: Client, headers: dict[str, str]) -> None:
    for method in ("GET", "POST"):
        response = await client.request(method, "/api/x", headers={**bearer(), **headers})
        assert response.status_code == 403, (method, headers)


async def test_the_token_in_the_address_sets_a_strict_cookie_and_leaves_the_address(
        client: Client) -> None:
    response = await client.get(f"/events?kind=tick&token={TOKEN}&key=engine")
    assert response.status_code == 303
    assert response.headers["location"] == "/events?kind=tick&key=engine"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}={SESSION};") and TOKEN not in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    page = await client.get("/events?kind=tick&key=engine", cookie=f"{COOKIE}={SESSION}")
    assert page.status_code == 200


async def test_a_wrong_token_in_the_address_sets_no_cookie(client: Client) -> None:
    response = await client.get("/?token=nope")
    assert response.status_code == 401
    assert "set-cookie" not in response.headers


async def test_a_token_in_the_address_of_a_post_is_not_accepted(client: Client) -> None:
    assert (await client.post(f"/api/x?token={TOKEN}")).status_code == 401


async def test_the_cookie_value_is_no_bearer_and_the_raw_token_is_no_cookie(
        client: Client) -> None:
    assert (await client.get("/api/x", headers={"authorization": f"Bearer {SESSION}"})
            ).status_code == 401
    assert (await client.get("/api/x", cookie=f"{COOKIE}={TOKEN}")).status_code == 401


async def test_another_ports_cookie_does_not_open_this_ui(client: Client) -> None:
    assert (await client.get("/", cookie=f"pulse_ui_9999={SESSION}")).status_code == 401


async def test_a_change_by_cookie_must_come_from_the_ui_itself(client: Client) -> None:
    cookies = f"{COOKIE}={SESSION}"
    assert (await client.post("/api/x", cookie=cookies)).status_code == 403
    same = await client.post("/api/x", cookie=cookies, headers={"sec-fetch-site": "same-origin"})
    assert same.status_code == 200
    origin = await client.post("/api/x", cookie=cookies,
                         headers={"origin": f"http://127.0.0.1:{PORT}"})
    assert origin.status_code == 200
    assert (await client.post("/api/x", headers=bearer())).status_code == 200  # programs: no CSRF


async def test_websockets_are_closed_and_lifespan_is_not_served() -> None:
    sent: list[dict[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope = {"type": "websocket", "path": "/ws", "headers": [(b"host", b"127.0.0.1:8421")]}
    await guarded()(scope, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]
    sent.clear()
    await guarded()({"type": "lifespan"}, receive, send)
    assert sent == []
