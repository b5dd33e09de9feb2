"""The web service: the UI's own process, started, watched, restarted and stopped with its
engine; its faults recorded, never silent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil
import pytest

from pulse_adapters.web import layer, read_token
from pulse_adapters.web._service import WebService
from pulse_core import Engine, LayerContext, SystemClock
from tests.timing import eventually


def web_engine(home: Path, port: int = 0) -> Engine:
    return Engine(home, layers=[layer({"port": port}, LayerContext(home, SystemClock()))])


SERVE_WITHIN_S = 30.0
# A test waits up to SERVE_WITHIN_S for the UI's process (niced) and up to 3 x 5 s for it to
# stop; beside other test workers on a busy machine both can take most of that.
TEST_TIME_LIMIT_S = 120


async def served(home: Path, other_than: int | None = None) -> dict[str, object]:
    """HOME/web.json once a UI process (not `other_than`) serves."""
    deadline = time.monotonic() + SERVE_WITHIN_S
    while time.monotonic() < deadline:
        try:
            found = json.loads((home / "web.json").read_text())
        except (OSError, ValueError):
            found = None
        if isinstance(found, dict) and found.get("pid") != other_than:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"no UI process served within {SERVE_WITHIN_S} s")


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    async with web_engine(tmp_path / "home") as running:
        yield running


async def test_the_ui_serves_from_a_niced_process_of_its_own(engine: Engine) -> None:
    found = await served(engine.home)
    child = psutil.Process(int(str(found["pid"])))
    assert child.pid != os.getpid() and child.ppid() == os.getpid()
    assert child.nice() >= psutil.Process().nice() + 10
    assert found["engine_pid"] == os.getpid()
    headers = {"authorization": f"Bearer {read_token(engine.home)}"}
    async with httpx.AsyncClient(headers=headers) as http:
        overview = (await http.get(f"{found['url']}api/overview")).json()
    assert overview["engine"]["started_at"] == engine.started_at


async def test_a_ui_process_that_dies_is_recorded_and_started_again(engine: Engine) -> None:
    first = await served(engine.home)
    os.kill(int(str(first["pid"])), signal.SIGKILL)
    second = await served(engine.home, other_than=int(str(first["pid"])))
    assert psutil.pid_exists(int(str(second["pid"])))
    errors = await engine.events.read(kinds=["error"])
    assert any("web UI's process" in str(e.data) and "exited" in str(e.data)
               for e in errors), errors
    (web,) = [loop for loop in engine.loops() if loop.name == "service:web"]
    assert web.restarts >= 1


async def test_a_port_in_use_is_an_error_naming_it_and_the_engine_runs_on(
        tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with web_engine(tmp_path / "home", port) as engine:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                errors = await engine.events.read(kinds=["error"])
                if any(f"127.0.0.1:{port}" in str(e.data) for e in errors):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the port in use was never reported")
            assert "port" in str(errors[-1].data)
            await engine.tick()  # the engine itself is unharmed
            assert not (engine.home / "web.json").exists()


async def test_closing_the_engine_stops_the_ui_and_withdraws_its_address(tmp_path: Path
                                                                         ) -> None:
    async with web_engine(tmp_path / "home") as engine:
        pid = int(str((await served(engine.home))["pid"]))
    assert not (tmp_path / "home" / "web.json").exists()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def test_with_port_0_a_new_engine_in_the_same_process_serves_on_the_same_port(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with web_engine(home):
        first = (await served(home))["url"]
    async with web_engine(home):
        again = (await served(home))["url"]
    assert again == first


def test_the_ui_stops_when_its_engine_is_killed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = textwrap.dedent(f"""
        import asyncio
        from pathlib import Path
        from pulse_adapters.web import layer
        from pulse_core import Engine, LayerContext, SystemClock

        async def main() -> None:
            home = Path({str(home)!r})
            web = layer({{"port": 0}}, LayerContext(home, SystemClock()))
            async with Engine(home, layers=[web]):
                await asyncio.sleep(120)

        asyncio.run(main())
    """)
    engine = subprocess.Popen([sys.executable, "-c", script])
    try:
        found = asyncio.run(served(home))
        child = int(str(found["pid"]))
        assert psutil.pid_exists(child)
        engine.kill()
        engine.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and psutil.pid_exists(child):
            try:
                if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the UI's process outlived its engine")
    finally:
        engine.kill()


async def test_a_ui_process_that_stops_reading_is_replaced_and_the_engine_ticks_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pulse_adapters.web import _service

    monkeypatch.setattr(_service, "STALLED_S", 1.0)
    monkeypatch.setattr(_service, "STOP_TIMEOUT_S", 1.0)
    home = tmp_path / "home"
    web = layer({"port": 0, "live_every_s": 0.1}, LayerContext(home, SystemClock()))
    async with Engine(home, layers=[web]) as engine:
        first = int(str((await served(home))["pid"]))
        os.kill(first, signal.SIGSTOP)  # its stdin fills: the reports can no longer go in
        try:
            ticks = engine.ticks
            second = await served(home, other_than=first)
            await engine.tick()
            assert engine.ticks > ticks
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(first, signal.SIGCONT)
        assert psutil.pid_exists(int(str(second["pid"])))
        errors = await engine.events.read(kinds=["error"])
        assert any("took no report" in str(e.data) for e in errors), errors


async def test_the_report_clips_long_error_texts(tmp_path: Path) -> None:
    from pulse_adapters.web import InstrumentReadings
    from pulse_adapters.web._report import TEXT_MAX, report_of
    from pulse_core import Decision, Inner, Snapshot

    async def loud(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        raise ValueError("x" * 5_000_000)

    async with Engine(tmp_path / "home", rules=[loud]) as engine:
        await engine.tick()
        report = await report_of(engine, False, InstrumentReadings())
    (traced,) = [t for t in report.trace if t.rule == "loud"]
    assert traced.error is not None and "ValueError" in traced.error
    assert len(traced.error) <= TEXT_MAX + 1


async def test_a_stop_whose_cancellation_a_wait_swallowed_still_ends_the_ui(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before Python 3.12, `asyncio.wait_for` can swallow a cancellation that comes as the
    awaited thing finishes; the service then served on, and closing the engine waited for it
    forever. Here a report's send swallows the stop's cancellation the same way: the service
    must honour it at its next turn, and the engine close."""
    real_send = WebService._send
    sends = 0
    swallowed = asyncio.Event()

    async def send(self: WebService, child: asyncio.subprocess.Process, data: object) -> None:
        nonlocal sends
        sends += 1
        await real_send(self, child, data)
        if sends > 1:  # a report while serving: the stop comes while it is sent
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                swallowed.set()

    monkeypatch.setattr(WebService, "_send", send)
    home = tmp_path / "home"
    engine = web_engine(home)
    await engine.open()
    try:
        await engine.start()
        await served(home)
        await eventually(lambda: sends > 1, what="a report sent while serving")
    finally:
        await asyncio.wait_for(engine.close(), 60)
    assert swallowed.is_set(), "the stop's cancellation never reached the report's send"
    assert not (home / "web.json").exists()
