"""The guard in front of every request of the web layer: Host, cross-site, then the token.

Checked in that order, for pages, static files, the JSON API, the event streams and /metrics
alike; nothing is served before all three pass:

1. the Host header must name the UI (127.0.0.1, localhost or [::1] on its port, or a name in
   `allowed_hosts`): a page on another site that rebinds its DNS name to 127.0.0.1 is refused;
2. a request a browser marks as coming from another site (Sec-Fetch-Site, or an Origin that
   is not the UI's) is refused, so no other page can drive the controls or read the data;
3. the token, from `Authorization: Bearer`, or the cookie a browser is given when it opens
   `/?token=...` (the address `upulse ui` prints; the token is then dropped from the address
   bar). The cookie holds a value derived from the token, never the token itself: browsers
   send a localhost cookie to every port of the host, and what another local server sees
   must not open the API as a bearer. A request authenticated by the cookie that changes
   anything must also say it comes from the UI's own origin. Compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                               "script-src 'self'; connect-src 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'self'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
_NEED_TOKEN = ("this pulse UI needs its token: run `upulse ui` and open the address it prints "
               "(programs send `Authorization: Bearer <token>`)\n")


def allowed_hosts(port: int, extra: tuple[str, ...] = (), bound: str = "127.0.0.1"
                  ) -> frozenset[str]:
    """Host header values the UI on `port` answers to: the loopback names on that port
    (and, for port 80, without it), the address it is `bound` to (unless a wildcard), plus
    `extra` as given."""
    names = {f"{name}:{port}" for name in LOOPBACK_NAMES}
    if bound not in ("0.0.0.0", "::"):
        names.add(f"[{bound}]:{port}" if ":" in bound else f"{bound}:{port}")
    if port == 80:
        names |= set(LOOPBACK_NAMES)
    return frozenset(name.lower() for name in names | set(extra))


class Guard:
    """ASGI middleware: refuse what fails the Host, cross-site or token check; add security
    headers to everything served."""

    def __init__(self, app: ASGIApp, *, token: str, hosts: frozenset[str], cookie: str) -> None:
        self.app = app
        self._token = token.encode()
        self._session = hmac.new(self._token, b"pulse-ui-cookie", hashlib.sha256).hexdigest()
        self.hosts = hosts
        self.cookie = cookie

    def _matches(self, offered: str | None) -> bool:
        return offered is not None and hmac.compare_digest(offered.encode(), self._token)

    def _session_matches(self, offered: str | None) -> bool:
        return offered is not None and hmac.compare_digest(offered.encode(),
                                                           self._session.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # no websockets, no lifespan: nothing else is served
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await _secured(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, _with_headers(send))

    def _refusal(self, scope: Scope) -> Response | None:
        """The response that refuses this request, or None to serve it."""
        headers = Headers(scope=scope)
        host = headers.get("host", "").lower()
        if host not in self.hosts:
            return PlainTextResponse(f"refused: this UI does not answer to Host {host!r}\n",
                                     status_code=421)
        site = headers.get("sec-fetch-site")
        origin = headers.get("origin")
        if site in ("cross-site", "same-site") or (
                origin is not None and origin.lower() != f"http://{host}"):
            return PlainTextResponse("refused: a request from another site\n", status_code=403)
        scheme, _, bearer = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            return None if self._matches(bearer.strip()) else _unauthorised(headers)
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if "token" in query and scope["method"] in SAFE_METHODS:
            return self._welcome(scope, query) if self._matches(query["token"]) else \
                _unauthorised(headers)
        if not self._session_matches(_cookie(headers, self.cookie)):
            return _unauthorised(headers)
        if scope["method"] not in SAFE_METHODS and site != "same-origin" and origin is None:
            return PlainTextResponse("refused: a change must come from the UI's own pages\n",
                                     status_code=403)
        return None

    def _welcome(self, scope: Scope, query: dict[str, str]) -> Response:
        """The right token in the address: set the cookie, then show the same address
        without the token."""
        del query["token"]
        rest = urlencode(query)
        target = scope["path"] + (f"?{rest}" if rest else "")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(self.cookie, self._session, httponly=True, samesite="strict",
                            path="/")
        return response


def _cookie(headers: Headers, name: str) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def _unauthorised(headers: Headers) -> Response:
    return PlainTextResponse(_NEED_TOKEN, status_code=401,
                             headers={"www-authenticate": 'Bearer realm="pulse"'})


def _with_headers(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            for name, value in SECURITY_HEADERS.items():
                headers.setdefault(name, value)
        await send(message)
    return sending


def _secured(response: Response) -> ASGIApp:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response
