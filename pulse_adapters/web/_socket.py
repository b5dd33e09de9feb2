"""A listening TCP socket for a server of pulse's, and the error that names why it has none."""

from __future__ import annotations

import socket


def listen_on(host: str, port: int, *, who: str, advice: str) -> socket.socket:
    """A non-blocking socket listening on host:port (0: a free port).

    OSError when it cannot be had, saying that `who` cannot listen on host:port, why, and
    then `advice` (what to change)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets NODELAY
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"{who} cannot listen on {host}:{port}: {exc.strerror} — "
                                 f"{advice}") from exc
    return sock


def url_of(sock: socket.socket) -> str:
    """The address a socket from `listen_on` serves, as a browser opens it."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"
