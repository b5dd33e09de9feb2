"""How the UI's server holds connections: uvicorn's HTTP/1.1 protocol (httptools) with two
bounds uvicorn does not give.

- A request must arrive whole (its line, headers and body) within `request_timeout_s` of its
  first byte, or of the connection opening: a client that sends half a request, or trickles
  it a byte at a time, is disconnected then. Between requests uvicorn's keep-alive timeout
  closes an idle connection.
- The UI holds at most `cap` connections, well below its process's file limit (half of it,
  up to MAX_CONNECTIONS). A connection beyond that closes the one that has waited longest
  for a request; when every connection is serving one, the newcomer is closed instead. So
  idle or half-sent connections, however many, never keep an operator's request out.

Accepting can still run out of files for a moment, in a burst: asyncio accepts every
connection waiting (up to the listen backlog's count) before any of them is made and can let
another go. It then tries again a second later, and reports each refused try;
`quiet_accept_errors` makes that one line a second instead of a traceback a try (up to 2,048
in one go, which took the niced UI's whole share of a busy CPU while the operator's
connection waited behind them).
"""

from __future__ import annotations

import asyncio
import math
import resource
import sys
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_CONNECTIONS = 1024
MIN_CONNECTIONS = 8
ACCEPT_REFUSED = "socket.accept() out of system resource"
"""How asyncio's accept loop reports a try refused for want of files or memory."""


def connection_cap() -> int:
    """How many connections the UI may hold: half its soft file limit, within
    MIN_CONNECTIONS..MAX_CONNECTIONS (the other half is left to its stores and files)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, soft // 2))


class BoundedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with the module's two bounds (made by `bounded_http`)."""

    request_timeout_s: ClassVar[float] = 10.0
    cap: ClassVar[int] = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_since = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._waiting_since = self.loop.time()
        self._await_request()
        if len(self.connections) > self.cap and sum(
                not c.transport.is_closing() for c in self.connections) > self.cap:
            self._shed()

    def connection_lost(self, exc: Exception | None) -> None:
        self._request_read()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:
            self._await_request()

    def on_message_complete(self) -> None:
        self._request_read()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._waiting_since = self.loop.time()
        super().on_response_complete()

    def _await_request(self) -> None:
        self._deadline = self.loop.call_later(self.request_timeout_s, self._too_slow)

    def _request_read(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def waiting(self) -> bool:
        """Whether this connection waits for a request (none started, or one not read
        whole) rather than serving one."""
        return self._deadline is not None or self.cycle is None or self.cycle.response_complete

    def _shed(self) -> None:
        """Close the connection that has waited longest for a request, else this one."""
        waiting = [c for c in self.connections if isinstance(c, BoundedHttp) and c is not self
                   and c.waiting() and not c.transport.is_closing()]
        victim = min(waiting, key=lambda c: c._waiting_since) if waiting else self
        victim.transport.close()


def bounded_http(timeout_s: float, most: int) -> type[BoundedHttp]:
    """BoundedHttp that waits `timeout_s` for a request and holds `most` connections, for
    uvicorn.Config(http=...)."""
    class Configured(BoundedHttp):
        request_timeout_s = timeout_s
        cap = most

    return Configured


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Have `loop` report accepts refused for want of files or memory in one line to stderr
    a second, with how many there were, instead of a traceback for each; any other error
    goes to the handler it had."""
    before = loop.get_exception_handler()
    refused = 0
    said_at = -math.inf

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        nonlocal refused, said_at
        if context.get("message") != ACCEPT_REFUSED:
            if before is None:
                loop.default_exception_handler(context)
            else:
                before(loop, context)
            return
        refused += 1
        if loop.time() - said_at >= 1.0:
            said_at = loop.time()
            print(f"pulse web: accepting connections: {context.get('exception')} (refused "
                  f"{refused} times since the last such line); tried again in a second, and "
                  "the connections waiting longest for a request are let go as new ones come",
                  file=sys.stderr, flush=True)
            refused = 0

    loop.set_exception_handler(handle)
