"""Clients that send half a request, or hold connections open by the hundred, over real
sockets against the UI's real process: they are disconnected after `request_timeout_s`, and
an operator's request is served meanwhile, even at the process's file limit."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from pulse_adapters.web._connections import ACCEPT_REFUSED, quiet_accept_errors
from pulse_core import EventDraft
from tests.web.conftest import UiProcess, wait_for

TIMEOUT_S = 1.0
"""The UI's request_timeout_s in these tests."""
CLOSED_WITHIN_S = 30.0
"""How long a test waits for the UI to close a connection (what only bounds a hang)."""


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiProcess]:
    served = UiProcess(tmp_path_factory.mktemp("slow") / "home",
                       {"port": 0, "request_timeout_s": TIMEOUT_S})
    served.start()
    try:
        yield served
    finally:
        served.stop()


def connect(ui: UiProcess) -> socket.socket:
    host, port = ui.host().rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=CLOSED_WITHIN_S)
    return sock


def half_request(ui: UiProcess) -> bytes:
    """A request line and some headers, without the blank line that ends them."""
    return f"GET /api/overview HTTP/1.1\r\nHost: {ui.host()}\r\nX-Slow: 1\r\n".encode()


def closed_by_server(sock: socket.socket, within_s: float = CLOSED_WITHIN_S) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `within_s`, reading and
    discarding whatever it sends first."""
    deadline = time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sock], [], [], left)
        if not ready:
            break
        try:
            if not sock.recv(65536):
                return True
        except ConnectionResetError:
            return True
    return False


def operator_served(ui: UiProcess) -> bool:
    response = httpx.get(ui.url + "api/overview", headers=ui.bearer(), timeout=CLOSED_WITHIN_S)
    return response.status_code == 200


def test_half_requests_are_disconnected_and_the_operator_is_served_meanwhile(
        ui: UiProcess) -> None:
    slow = [connect(ui) for _ in range(30)]
    try:
        for sock in slow:
            sock.sendall(half_request(ui))
        assert operator_served(ui)
        assert all(closed_by_server(sock) for sock in slow)
    finally:
        for sock in slow:
            sock.close()


def test_a_connection_that_sends_nothing_is_disconnected(ui: UiProcess) -> None:
    with connect(ui) as sock:
        assert closed_by_server(sock)


def test_a_request_trickled_a_byte_at_a_time_is_disconnected(ui: UiProcess) -> None:
    """The timeout bounds the whole request, not the gap between its bytes."""
    with connect(ui) as sock:
        deadline = time.monotonic() + CLOSED_WITHIN_S
        closed = False
        for byte in (half_request(ui) + b"X-Pad: " + b"a" * 10_000):
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # the server has closed it
                closed = True
                break
            if closed_by_server(sock, within_s=0.1):
                closed = True
                break
            assert time.monotonic() < deadline, "still open while its bytes trickled in"
        assert closed


def test_a_body_sent_in_part_is_disconnected(ui: UiProcess) -> None:
    with connect(ui) as sock:
        sock.sendall(f"POST /api/effects/e-1/cancel HTTP/1.1\r\nHost: {ui.host()}\r\n"
                     f"Authorization: Bearer {ui.token}\r\nContent-Type: application/json\r\n"
                     "Content-Length: 100\r\n\r\n{\"reason\": ".encode())
        assert closed_by_server(sock)


def test_a_kept_alive_connection_waits_no_longer_for_its_next_request(ui: UiProcess) -> None:
    with connect(ui) as sock:
        sock.sendall(f"GET /api/overview HTTP/1.1\r\nHost: {ui.host()}\r\n"
                     f"Authorization: Bearer {ui.token}\r\n\r\n".encode())
        assert b"200 OK" in sock.recv(65536)
        sock.sendall(half_request(ui))
        assert closed_by_server(sock)


def test_a_live_stream_outlasts_the_request_timeout(ui: UiProcess) -> None:
    headers = ui.bearer()
    with httpx.stream("GET", ui.url + "stream/events", headers=headers,
                      timeout=CLOSED_WITHIN_S) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("retry:")
        outlasted = time.monotonic() + 3 * TIMEOUT_S
        wait_for(lambda: time.monotonic() > outlasted, 10, "three request timeouts to pass")
        ui.append(EventDraft("task-created", "slow-clients", {
            "title": "still here", "project": "web", "prompt": "", "priority": 0}))
        assert "still here" in _first_data(lines)


def _first_data(lines: Iterator[str]) -> str:
    for line in lines:
        if line.startswith("data:"):
            return line
    raise AssertionError("the stream ended before an event came")


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[UiProcess]:
    """A UI process allowed 64 files, with a request timeout far longer than the test, its
    stderr in tmp_path/ui.stderr."""
    served = UiProcess(tmp_path / "home", {"port": 0, "request_timeout_s": 120}, files=64,
                       stderr=tmp_path / "ui.stderr")
    served.start()
    try:
        yield served
    finally:
        served.stop()


def test_at_the_file_limit_idle_connections_make_way_for_the_operator(
        limited: UiProcess) -> None:
    idle: list[socket.socket] = []
    assert limited.process is not None
    try:
        # All of them queued before the UI takes any (the kernel answers for it while it is
        # stopped): its first accepts then run out of files, whatever the machine's speed.
        os.kill(limited.process.pid, signal.SIGSTOP)
        try:
            for n in range(150):  # more than the process may hold files
                sock = connect(limited)
                if n % 2:
                    sock.sendall(half_request(limited))
                idle.append(sock)
        finally:
            os.kill(limited.process.pid, signal.SIGCONT)
        assert operator_served(limited)
        assert closed_by_server(idle[0]), "the connection idle longest was not let go"
        child = psutil.Process(limited.process.pid)
        assert child.rlimit(psutil.RLIMIT_NOFILE) == (64, 64) and child.num_fds() < 64
        for _ in range(3):
            assert operator_served(limited)
    finally:
        for sock in idle:
            with contextlib.suppress(OSError):
                sock.close()
    # Accepts refused at the limit are told in a line a second, not a traceback a try (up
    # to 2,048 a burst, which took a niced UI's share of a busy CPU: the operator waited).
    assert limited.stderr is not None
    told = limited.stderr.read_text()
    assert "Traceback" not in told, told[-2000:]
    assert 1 <= told.count("pulse web: accepting connections: [Errno 24]") <= 60, told[-2000:]


def test_refused_accepts_are_told_once_a_second_and_other_errors_as_before(
        capsys: pytest.CaptureFixture[str]) -> None:
    loop = asyncio.new_event_loop()
    seen: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: seen.append(context))
    try:
        quiet_accept_errors(loop)
        refused = OSError(errno.EMFILE, "Too many open files")
        for _ in range(2048):
            loop.call_exception_handler({"message": ACCEPT_REFUSED, "exception": refused})
        other = {"message": "Task exception was never retrieved", "exception": ValueError()}
        loop.call_exception_handler(other)
    finally:
        loop.close()
    told = capsys.readouterr().err.splitlines()
    assert told == [
        "pulse web: accepting connections: [Errno 24] Too many open files (refused 1 times "
        "since the last such line); tried again in a second, and the connections waiting "
        "longest for a request are let go as new ones come"]
    assert seen == [other]  # the handler the loop had
