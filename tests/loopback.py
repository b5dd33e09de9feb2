"""A threaded HTTP server on 127.0.0.1 for tests: started on an ephemeral port, stoppable,
and restartable on the same port. Test servers own one and hand it their handler."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class RecordedRequest:
    """One request a loopback server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


def read_request(handler: BaseHTTPRequestHandler) -> RecordedRequest:
    """The request `handler` is serving, body read, header names lower-cased."""
    length = int(handler.headers.get("Content-Length") or 0)
    body = handler.rfile.read(length) if length else b""
    return RecordedRequest(handler.command, handler.path,
                           {k.lower(): v for k, v in handler.headers.items()}, body)


class _QuietServer(ThreadingHTTPServer):
    """Clients that hang up mid-answer are part of the tests, not errors worth printing."""

    def handle_error(self, request: object, client_address: object) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class LoopbackServer:
    """Serves a handler on 127.0.0.1 in a daemon thread; `port` stays fixed across restarts."""

    def __init__(self) -> None:
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        """Bind (the same port as before, if any) and serve `handler` until `shutdown`."""
        server = _QuietServer((LOOPBACK, self.port), handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever,
                                        kwargs={"poll_interval": 0.02},
                                        name=f"{type(self).__name__}-{self.port}", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop serving and close the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
