"""Fixtures of the survival tests: loopback servers (DNS over UDP, HTTP), engines that are
always closed, and a reaper of the processes a test started.

Every server binds 127.0.0.1 only, on an ephemeral port, and can be stopped and started again
on the same port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

from pulse_core import Engine
from tests.loopback import LOOPBACK, LoopbackServer, RecordedRequest, read_request

# -- processes -------------------------------------------------------------------------------


@pytest.fixture
def reaper() -> Iterator[list[int]]:
    """Pids to kill at the end, whatever happens."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# -- DNS -------------------------------------------------------------------------------------


class LoopbackDns:
    """A UDP DNS server on 127.0.0.1 built on dnspython's message API.

    `answers` maps names (without the final dot) to an IPv4 address; other names get
    NXDOMAIN. `answering = False` keeps the port open but drops every query (a resolver then
    times out); `stop()` closes the port (queries are refused); `start()` opens it again on
    the same port.
    """

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.answering = True
        self.port = 0
        self.queries: list[str] = []
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, self.port))
        sock.settimeout(0.02)
        self.port = sock.getsockname()[1]
        self._sock, self._stop = sock, threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(sock, self._stop),
                                        name=f"loopback-dns-{self.port}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _serve(self, sock: socket.socket, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                wire, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                query = dns.message.from_wire(wire)
            except Exception:
                continue
            question = query.question[0]
            self.queries.append(question.name.to_text(omit_final_dot=True))
            if not self.answering:
                continue
            response = dns.message.make_response(query)
            response.flags |= dns.flags.AA
            address = self.answers.get(question.name.to_text(omit_final_dot=True))
            if address is not None and question.rdtype == dns.rdatatype.A:
                response.answer.append(dns.rrset.from_text(question.name, 60, "IN", "A",
                                                           address))
            else:
                response.set_rcode(dns.rcode.NXDOMAIN)
            try:
                sock.sendto(response.to_wire(), peer)
            except OSError:
                return


@pytest.fixture
def dns_server() -> Iterator[LoopbackDns]:
    """A loopback DNS server answering agent.test -> 10.20.30.40, stopped after the test."""
    server = LoopbackDns({"agent.test": "10.20.30.40"})
    server.start()
    try:
        yield server
    finally:
        server.stop()


# -- HTTP ------------------------------------------------------------------------------------


@dataclass
class LoopbackHttp:
    """A ThreadingHTTPServer on 127.0.0.1 that records every request.

    GET and POST answer `status` (settable per path in `statuses`), or what `judge` says of
    the request when one is set; `stop()` closes the port; `start()` opens it again on the
    same port.
    """

    status: int = 200
    statuses: dict[str, int] = field(default_factory=dict)
    judge: Callable[[RecordedRequest], int] | None = None
    requests: list[RecordedRequest] = field(default_factory=list)
    _http: LoopbackServer = field(default_factory=LoopbackServer)

    @property
    def port(self) -> int:
        """The port the server listens on (0 before the first start)."""
        return self._http.port

    def url(self, path: str) -> str:
        return f"http://{LOOPBACK}:{self.port}{path}"

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                request = read_request(self)
                owner.requests.append(request)
                status = (owner.judge(request) if owner.judge is not None
                          else owner.statuses.get(self.path, owner.status))
                payload = b"ok" if status < 400 else b"failing"
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = _answer
            do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http.serve(Handler)

    def stop(self) -> None:
        self._http.shutdown()


def _serving() -> Iterator[LoopbackHttp]:
    server = LoopbackHttp()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def http_server() -> Iterator[LoopbackHttp]:
    """A loopback HTTP server, stopped after the test."""
    yield from _serving()


@pytest.fixture
def hook_server() -> Iterator[LoopbackHttp]:
    """A second loopback HTTP server, for webhooks."""
    yield from _serving()


# -- engines ---------------------------------------------------------------------------------


@pytest.fixture
async def open_engine() -> AsyncIterator[Callable[..., Any]]:
    """`await open_engine(home, **kwargs)`: an opened Engine, closed after the test."""
    engines: list[Engine] = []

    async def make(home: Path, **kwargs: Any) -> Engine:
        engine = Engine(home, **kwargs)
        await engine.open()
        engines.append(engine)
        return engine

    try:
        yield make
    finally:
        for engine in reversed(engines):
            await engine.close()

