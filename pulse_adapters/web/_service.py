"""The web layer's service: the UI in a process of its own, started and watched by the engine.

Run under the engine's supervisor like every service, it starts `python -m
pulse_adapters.web` (pulse_adapters.web._child), hands it its settings on stdin, waits for the
address it serves, writes HOME/web.json, then sends it the engine's report every
`live_every_s`. Pages, streams and /metrics are served in that process, so no request ever
waits on the engine's loop, nor the engine on a request. If the process exits (a port in use,
a crash), the service raises with what it said on stderr: an `error` event, and a new process
after the supervisor's backoff. When the engine stops, the process is stopped with it; if the
engine dies, the process sees its stdin end and stops too.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from pulse_adapters.web._metrics import InstrumentTally
from pulse_adapters.web._report import EngineReport, report_of
from pulse_adapters.web._settings import WebSettings, address_path, ensure_token
from pulse_core import redact_urls, write_private

if TYPE_CHECKING:
    from pulse_core import Engine, EngineDirectory

log = logging.getLogger("pulse.web")

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
STDERR_KEPT = 20
STALLED_S = 30.0
"""A UI process that takes no report for this long (its stdin full) is stopped and restarted."""

_last_port: dict[Path, int] = {}
"""The port each home's UI last served on in this process: with `port` 0 a reload (a new
engine, a new UI process) asks for it again, so an open page reconnects where it was."""


class WebUnavailable(RuntimeError):
    """The UI's process did not start, or stopped; the message holds what it said."""


class WebService:
    """The `web` service: the UI's process for the engine it is started with."""

    name = "web"  # the service's name under the supervisor: `service:web`

    def __init__(self, home: Path, settings: WebSettings,
                 directory: EngineDirectory | None = None) -> None:
        self.home = home
        self.settings = settings
        self.directory = directory
        self.url: str | None = None  # while it serves
        self._said: collections.deque[str] = collections.deque(maxlen=STDERR_KEPT)

    async def __call__(self, engine: Engine) -> None:
        await asyncio.to_thread(ensure_token, self.home)
        tally = InstrumentTally()
        detach = engine.instrument(tally)

        async def report() -> EngineReport:
            return await report_of(engine, self.directory is not None, tally.readings())

        try:
            await self._serve(engine, report)
        finally:
            detach()

    async def _serve(self, engine: Engine, report: Callable[[], Awaitable[EngineReport]]
                     ) -> None:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pulse_adapters.web", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        listening = asyncio.create_task(self._listen(child))
        try:
            await self._send(child, {
                "home": str(self.home), "store": engine.store_url,
                "placement": engine.placement, "settings": msgspec.to_builtins(self.settings),
                "prefer_port": _last_port.get(self.home),
                "report": msgspec.to_builtins(await report())})
            self.url = await self._address(child)
            _last_port[self.home] = int(self.url.rstrip("/").rsplit(":", 1)[1])
            await asyncio.to_thread(self._announce, self.url, child.pid)
            me = asyncio.current_task()
            while child.returncode is None:
                if me is not None and me.cancelling():
                    # a stop whose cancellation a wait swallowed (a library's, as
                    # asyncio.wait_for could before Python 3.12): honour it, never serve on
                    raise asyncio.CancelledError
                await self._send(child, msgspec.to_builtins(await report()))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.live_every_s):
                        await asyncio.shield(listening)
            raise WebUnavailable(self._ended(child))
        finally:
            self.url = None
            await _stop(child)
            listening.cancel()
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self._withdraw, child.pid)

    async def _send(self, child: asyncio.subprocess.Process, data: object) -> None:
        assert child.stdin is not None
        try:
            child.stdin.write(json.dumps(data, separators=(",", ":")).encode() + b"\n")
            async with asyncio.timeout(STALLED_S):
                await child.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            await child.wait()
            raise WebUnavailable(self._ended(child)) from None
        except TimeoutError:
            raise WebUnavailable(
                f"the web UI's process (pid {child.pid}) took no report for {STALLED_S:g} s "
                "(stopped or hung); it is stopped and started again") from None

    async def _address(self, child: asyncio.subprocess.Process) -> str:
        assert child.stdout is not None
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                line = await child.stdout.readline()
        except TimeoutError:
            raise WebUnavailable(f"the web UI's process did not serve within "
                                 f"{START_TIMEOUT_S:g} s") from None
        try:
            return str(json.loads(line)["url"])
        except (ValueError, KeyError, TypeError):
            await child.wait()
            raise WebUnavailable(self._ended(child)) from None

    async def _listen(self, child: asyncio.subprocess.Process) -> None:
        """Keep (and log) what the UI's process says on stderr, until it ends."""
        assert child.stderr is not None
        while line := await child.stderr.readline():
            text = redact_urls(line.decode(errors="replace").rstrip())
            self._said.append(text)
            log.warning("pulse web (pid %d): %s", child.pid, text)
        await child.wait()

    def _ended(self, child: asyncio.subprocess.Process) -> str:
        said = " / ".join(self._said) or "nothing on stderr"
        return f"the web UI's process (pid {child.pid}) exited with status " \
               f"{child.returncode}: {said}"

    def _announce(self, url: str, pid: int) -> None:
        write_private(address_path(self.home),
                      json.dumps({"url": url, "pid": pid, "engine_pid": os.getpid()}
                                 ).encode() + b"\n")

    def _withdraw(self, pid: int) -> None:
        path = address_path(self.home)
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text()).get("pid") != pid:
                return  # a newer process's address
        path.unlink(missing_ok=True)


async def _stop(child: asyncio.subprocess.Process) -> None:
    """End the UI's process: its stdin closed (it stops serving), then SIGTERM, then SIGKILL."""
    if child.returncode is not None:
        return
    if child.stdin is not None:
        child.stdin.close()
    waiting = asyncio.ensure_future(child.wait())
    try:
        for signal_it in (None, child.terminate, child.kill):
            if signal_it is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal_it()
            # asyncio.wait, not asyncio.timeout: this runs while a stop cancels the service,
            # and before Python 3.11.3 a timeout entered in a task being cancelled never
            # expires as a timeout (the process would be left running)
            done, _ = await asyncio.wait({waiting}, timeout=STOP_TIMEOUT_S)
            if done:
                return
    finally:
        waiting.cancel()
