"""systemd's notify protocol: READY=1, RELOADING=1, WATCHDOG=1 and STOPPING=1 for a daemon
running under a unit with `Type=notify` (docs/cli.md, "Running under systemd").

systemd gives the service the address of a unix datagram socket in $NOTIFY_SOCKET (a path, or
an abstract name written with a leading '@') and, with `WatchdogSec=`, the interval it
expects WATCHDOG=1 within in $WATCHDOG_USEC (for the process $WATCHDOG_PID, when set). Each
message is one datagram of `KEY=value` lines. Without $NOTIFY_SOCKET every call does nothing,
so the daemon calls them unconditionally.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import MutableMapping

log = logging.getLogger("pulse")

NOTIFY_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
"""What systemd tells the service; taken out of the environment, so that the processes the
daemon starts (restarted essential processes, the web UI's) never speak for it."""


def _address(value: str) -> str | bytes:
    """The socket address $NOTIFY_SOCKET names: a path, or (from '@name') an abstract one."""
    return b"\0" + value[1:].encode() if value.startswith("@") else value


class SystemdNotifier:
    """Sends notify messages to `socket_path` (None: not under systemd; nothing is sent).

    `watchdog_s` is how often WATCHDOG=1 is due: half of $WATCHDOG_USEC, as sd_notify(3)
    advises (None: no watchdog, or one meant for another process). A message that cannot be
    sent is logged once, on the `pulse` logger, and never stops the daemon.
    """

    def __init__(self, socket_path: str | None, watchdog_usec: int | None = None) -> None:
        self.socket_path = socket_path or None
        self.watchdog_s = None if not watchdog_usec or self.socket_path is None \
            else watchdog_usec / 2 / 1_000_000
        self._failed = False

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] | None = None
                         ) -> SystemdNotifier:
        """The notifier systemd's variables in `environ` (default os.environ) describe; the
        variables are removed from it. $WATCHDOG_USEC counts only when $WATCHDOG_PID is
        unset or is this process."""
        env = os.environ if environ is None else environ
        path, usec, pid = (env.pop(name, None) for name in NOTIFY_VARIABLES)
        ours = pid is None or pid.strip() == str(os.getpid())
        try:
            watchdog = int(usec) if usec and ours else None
        except ValueError:
            log.warning("pulse: WATCHDOG_USEC=%r is not a number of microseconds; the "
                        "watchdog is not served", usec)
            watchdog = None
        return cls(path, watchdog)

    @property
    def active(self) -> bool:
        """Whether there is a socket to notify."""
        return self.socket_path is not None

    def send(self, *lines: str) -> bool:
        """Send `lines` (`KEY=value`) as one datagram; whether it was sent."""
        if self.socket_path is None:
            return False
        message = "\n".join(lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)  # a full queue must not block the daemon's loop
                sock.sendto(message, _address(self.socket_path))
        except OSError as exc:
            if not self._failed:
                log.warning("pulse: cannot notify systemd at %s: %s", self.socket_path, exc)
                self._failed = True
            return False
        return True

    def ready(self, status: str) -> bool:
        """READY=1: the daemon serves (its engine runs); with its pid and a status line."""
        return self.send("READY=1", f"MAINPID={os.getpid()}", f"STATUS={_line(status)}")

    def reloading(self, status: str) -> bool:
        """RELOADING=1: a reload began (READY=1 follows once it is done, or given up)."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1_000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", f"STATUS={_line(status)}")

    def stopping(self, status: str) -> bool:
        """STOPPING=1: the daemon is draining and will exit."""
        return self.send("STOPPING=1", f"STATUS={_line(status)}")

    def watchdog(self) -> bool:
        """WATCHDOG=1: the daemon's main loop is alive."""
        return self.send("WATCHDOG=1")


def _line(text: str) -> str:
    """`text` on one line, as a `STATUS=` value must be."""
    return " ".join(text.split())
