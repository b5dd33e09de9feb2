"""The UI's own process: `python -m pulse_adapters.web`, started by the web service.

It reads one JSON line of settings on stdin (home, store URL, placement, the layer's
settings), builds the layers HOME/config.json names to learn their pages (pulse_adapters.web.
_pages), opens the home's stores read-only, binds its port, prints one JSON line
`{"url": ...}` on stdout once it serves, then takes each further stdin line as the engine's
newest EngineReport. When stdin ends (the engine stopped it, or died) it stops serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import msgspec
import uvicorn

from pulse_adapters.web._connections import bounded_http, connection_cap, quiet_accept_errors
from pulse_adapters.web._pages import configured_pages
from pulse_adapters.web._report import EngineReport
from pulse_adapters.web._settings import load_settings, read_token
from pulse_adapters.web._socket import listen_on, url_of
from pulse_adapters.web._view import RESERVED, EngineView
from pulse_core import HomeLayout, Principal
from pulse_core.store import ElementKeys, ObjectStore, SqliteVitalsStore, open_event_store

SHUTDOWN_GRACE_S = 2
NICENESS = 10
"""How much lower the UI's process runs than its engine: a busy page never takes a core a
tick needs."""


class Server(uvicorn.Server):
    """uvicorn whose stop comes from the engine (stdin's end), not from signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


async def _follow_reports(view: EngineView, server: Server) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 22)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    decoder = msgspec.json.Decoder(EngineReport)
    told = False
    try:
        while line := await reader.readline():
            try:
                view.update(decoder.decode(line))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                if not told:  # an engine of another version: say it once, keep serving
                    print(f"pulse web: a report from the engine cannot be read: {exc}",
                          file=sys.stderr, flush=True)
                    told = True
    except Exception as exc:  # a line too long, a broken pipe: stop, and the engine restarts us
        print(f"pulse web: reading the engine's reports failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
    server.should_exit = True  # the engine is gone, or asked us to stop


def _bind(host: str, port: int, prefer: object) -> socket.socket:
    """The UI's socket: on `port`; with port 0, on the port it had before a reload (`prefer`)
    when that is still free, else any."""
    def bind(on: int) -> socket.socket:
        return listen_on(host, on, who="the web UI", advice="set another `port` under "
                         "layers.web in config.json (0 picks a free one)")

    if port == 0 and isinstance(prefer, int) and prefer > 0:
        with contextlib.suppress(OSError):
            return bind(prefer)
    return bind(port)


async def serve(setup: dict[str, Any]) -> None:
    """Serve the UI of the home `setup` names until stdin ends."""
    from pulse_adapters.web._app import build_app

    home = Path(setup["home"])
    layout = HomeLayout.at(home)
    settings = load_settings(setup.get("settings"))
    url = str(setup.get("store") or layout.store_url())
    placement = str(setup.get("placement", ""))
    pages = configured_pages(home, placement, RESERVED)
    objects = ObjectStore(layout.objects, read_only=True)
    # The writer first: SQLite maps a file's shared memory once per process, read-only when
    # a read-only connection opened it first, and a writer opened after could not write.
    writer = await open_event_store(url, objects=objects, principal=Principal.human("web"))
    events = await open_event_store(url, read_only=True, objects=objects)
    writer.keys = ElementKeys(layout.keys_db)  # the home's element keys (sealed text)
    events.keys = ElementKeys(layout.keys_db, read_only=True)
    vitals = await SqliteVitalsStore.open(layout.vitals_db, read_only=True)
    try:
        view = EngineView(home, events=events, writer=writer, vitals=vitals, objects=objects,
                          placement=placement, pages=pages)
        view.update(msgspec.convert(setup.get("report") or {}, EngineReport))
        sock = _bind(settings.host, settings.port, setup.get("prefer_port"))
        app = build_app(view, settings, read_token(home), sock.getsockname()[1])
        server = Server(uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off", proxy_headers=False,
            server_header=False, timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
            http=bounded_http(settings.request_timeout_s, connection_cap())))
        quiet_accept_errors(asyncio.get_running_loop())
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():  # noqa: ASYNC110 (no start event)
            await asyncio.sleep(0.01)
        if server.started:
            print(json.dumps({"url": url_of(sock)}), flush=True)
        following = asyncio.create_task(_follow_reports(view, server))
        try:
            await serving
        finally:
            following.cancel()
            sock.close()
    finally:
        await events.close()
        await vitals.close()
        await writer.close()


def main() -> int:
    """The child's entry: settings from stdin's first line, then serve."""
    with contextlib.suppress(OSError):  # the UI yields the CPU to the engine it shows
        os.nice(NICENESS)
    line = sys.stdin.buffer.readline()
    try:
        setup = json.loads(line)
    except ValueError:
        print("pulse web: the first line on stdin must be the JSON settings", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(setup))
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # told to the engine, which records it as an error event
        print(f"pulse web: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0
