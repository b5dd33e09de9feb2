"""The MCP server over streamable HTTP (the SDK's own transport), on 127.0.0.1 only, behind
the web UI's token: a request without `Authorization: Bearer <HOME/ui.token>` is answered
401 and recorded as `mcp-request-refused` (at most REFUSALS_RECORDED a minute; the ones past
that are counted in the next record)."""

from __future__ import annotations

import hashlib
import hmac
import socket
from collections.abc import Callable

import msgspec
import uvicorn
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from pulse_adapters.mcp._calls import Calls, Limiter
from pulse_adapters.web import listen_on
from pulse_core import EventDraft, LayerError, register_kind

LOOPBACK = "127.0.0.1"
HTTP_PORT = 8422
PATH = "/mcp"
REQUEST_REFUSED = "mcp-request-refused"
REFUSALS_RECORDED = 10  # a minute: a flood of bad requests must not flood the log
SHUTDOWN_S = 5  # on SIGTERM, how long calls in flight (and open streams) may take to end


class McpPortUnavailable(LayerError):
    """`upulse mcp --http` cannot listen on its port (taken, or not this user's to bind)."""


class RequestRefused(msgspec.Struct, frozen=True):
    """mcp-request-refused: an HTTP request to the MCP server without the right token."""

    method: str
    path: str
    reason: str
    unrecorded: int = 0  # refusals since the previous record that were not recorded


register_kind(REQUEST_REFUSED, "an HTTP request to `upulse mcp --http` refused (401: no or a "
              "wrong bearer token); key: mcp:<agent>", RequestRefused)


class BearerGate:
    """ASGI middleware: pass on a request whose bearer token is the home's; answer 401 to
    any other, recording it. Lifespan messages pass through (the SDK's session manager)."""

    def __init__(self, app: ASGIApp, *, token: str, calls: Calls) -> None:
        self.app = app
        self.digest = hashlib.sha256(token.encode()).digest()
        self.calls = calls
        self.limiter = Limiter(REFUSALS_RECORDED)
        self.unrecorded = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        reason = self._refusal(Headers(scope=scope))
        if reason is None:
            await self.app(scope, receive, send)
            return
        await self._record(scope, reason)
        response = PlainTextResponse(
            f"refused: {reason} — send `Authorization: Bearer <token>` with the home's web UI "
            "token (`upulse ui` prints it)\n", status_code=401,
            headers={"www-authenticate": 'Bearer realm="pulse"'})
        await response(scope, receive, send)

    def _refusal(self, headers: Headers) -> str | None:
        """Why this request is refused, None when its token is right (compared by digest,
        in constant time)."""
        scheme, _, offered = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not offered.strip():
            return "no bearer token"
        given = hashlib.sha256(offered.strip().encode()).digest()
        return None if hmac.compare_digest(given, self.digest) else "a wrong bearer token"

    async def _record(self, scope: Scope, reason: str) -> None:
        if not self.limiter.allow():
            self.unrecorded += 1
            return
        body = RequestRefused(str(scope.get("method", ""))[:16],
                              str(scope.get("path", ""))[:200], reason, self.unrecorded)
        self.unrecorded = 0
        await self.calls.store.append([EventDraft(
            REQUEST_REFUSED, self.calls.key, msgspec.to_builtins(body),
            origin=self.calls.origin)])


def listen(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:`port` (0: a free port); McpPortUnavailable naming
    the port."""
    try:
        return listen_on(LOOPBACK, port, who="upulse mcp",
                         advice="give another --port (0 picks a free one)")
    except OSError as exc:
        raise McpPortUnavailable(exc.strerror or str(exc)) from exc


async def serve_http(app: ASGIApp, token: str, calls: Calls, port: int,
                     announce: Callable[[str], None]) -> None:
    """Serve `app` (the SDK's streamable HTTP app) behind the token on 127.0.0.1:`port`
    until SIGINT or SIGTERM (then SHUTDOWN_S for what is in flight); `announce` is given the
    endpoint's URL once it listens."""
    sock = listen(port)
    config = uvicorn.Config(BearerGate(app, token=token, calls=calls), log_level="warning",
                            lifespan="on", access_log=False,
                            timeout_graceful_shutdown=SHUTDOWN_S)
    server = uvicorn.Server(config)
    announce(f"http://{LOOPBACK}:{sock.getsockname()[1]}{PATH}")
    await server.serve(sockets=[sock])
