"""The web layer's service: the UI's ASGI app served by uvicorn inside the engine's loop.

It runs under the engine's supervisor like every service: a port already taken is an
`error` event and a retry after the shared backoff, never a daemon that exits. The socket is
bound here, before uvicorn sees it, so a bind failure is an ordinary OSError; uvicorn's own
signal handling is off (the daemon owns SIGTERM and SIGHUP) and it logs nothing of its own
(an access log would carry the token of a first visit).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from pulse_adapters.web._settings import WebSettings, address_path, ensure_token
from pulse_core._homelock import write_private

if TYPE_CHECKING:
    from pulse_core import Engine, EngineDirectory

SHUTDOWN_GRACE_S = 2
"""How long open streams get to finish when the service stops (a reload, the daemon's stop)."""


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the engine's owner decides when it stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (OSError, naming both, when it cannot be had)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"the web UI cannot listen on {host}:{port}: {exc.strerror} "
                                 "— set another `port` under layers.web in config.json "
                                 "(0 picks a free one)") from exc
    return sock


def url_of(sock: socket.socket) -> str:
    """The address a socket from `bind` serves, as a browser opens it."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


class WebService:
    """The `web` service: serve the UI of the engine it is started with, until cancelled."""

    def __init__(self, home: Path, settings: WebSettings,
                 directory: EngineDirectory | None = None) -> None:
        self.home = home
        self.settings = settings
        self.directory = directory
        self.url: str | None = None  # while it serves

    name = "web"  # the service's name under the supervisor: `service:web`

    async def __call__(self, engine: Engine) -> None:
        from pulse_adapters.web._app import build_app

        token = await asyncio.to_thread(ensure_token, self.home)
        sock = bind(self.settings.host, self.settings.port)
        port = sock.getsockname()[1]
        app = build_app(engine, self.settings, token, port, self.directory)
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                                timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
                                proxy_headers=False, server_header=False)
        server = _Server(config)
        serving = asyncio.create_task(server.serve(sockets=[sock]), name="pulse-web-uvicorn")
        try:
            while not server.started:
                if serving.done():
                    break
                await asyncio.sleep(0.01)
            if server.started:
                self.url = url_of(sock)
                await asyncio.to_thread(self._announce, self.url)
            try:
                await serving
            except SystemExit as exc:  # uvicorn's way to say it could not start
                raise RuntimeError(f"uvicorn stopped serving the web UI (exit {exc.code})"
                                   ) from None
        finally:
            self.url = None
            server.should_exit = True
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(serving), SHUTDOWN_GRACE_S + 1)
            serving.cancel()
            sock.close()
            with contextlib.suppress(OSError):
                self._withdraw()

    def _announce(self, url: str) -> None:
        write_private(address_path(self.home),
                      json.dumps({"url": url, "pid": os.getpid()}).encode() + b"\n")

    def _withdraw(self) -> None:
        path = address_path(self.home)
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text()).get("pid") != os.getpid():
                return  # another process's service wrote it since
        path.unlink(missing_ok=True)
