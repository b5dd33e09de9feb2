"""A threaded HTTP server on 127.0.0.1 for tests: started on an ephemeral port, stoppable,
and restartable on the same port. Test servers own one and hand it their handler."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pulse_adapters.llm.stand_in import LOOPBACK, QuietHTTPServer, RecordedRequest, read_request

__all__ = ["LOOPBACK", "LoopbackServer", "RecordedRequest", "read_request"]


class LoopbackServer:
    """Serves a handler on 127.0.0.1 in a daemon thread; `port` stays fixed across restarts."""

    def __init__(self) -> None:
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        """Bind (the same port as before, if any) and serve `handler` until `shutdown`."""
        server = QuietHTTPServer((LOOPBACK, self.port), handler)
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
