"""Real PostgreSQL and Redis servers on 127.0.0.1 for tests and benchmarks.

PostgreSQL comes from Debian's `postgresql` package: `initdb` into a temporary folder and
`pg_ctl` on a free loopback port (as the `postgres` user when this runs as root, since
PostgreSQL refuses to run as root). Redis is Debian's `redis-server`, with no persistence.
Both can be stopped, killed and started again on the same port, for fault tests.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

LOOPBACK = "127.0.0.1"
MISSING = ("PostgreSQL and redis-server are needed by the fleet tests: `./dev test` installs "
           "them as root (apt-get install postgresql redis-server); otherwise install them")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                   key=lambda p: int(Path(p).parts[4]))
    if found:
        return found[-1]
    on_path = shutil.which(name)
    if on_path is None:
        raise RuntimeError(f"{name} not found — {MISSING}")
    return on_path


class PostgresServer:
    """One PostgreSQL cluster in `root`, listening on 127.0.0.1:`port` (trust auth for the
    superuser `pulse`). `url(db)` names a database in it; `create_database()` makes a fresh
    one."""

    def __init__(self, root: Path, *, fsync: bool = False) -> None:
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.fsync = fsync
        self.user = "pulse"
        self._as: str | None = "postgres" if os.geteuid() == 0 else None

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), user=self._as, check=check, capture_output=True,
                              text=True, timeout=120, cwd="/")

    def init(self) -> PostgresServer:
        """Create the cluster (once) and start it."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self._as is not None:
            pw = pwd.getpwnam(self._as)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run(_pg_bin("initdb"), "-D", str(self.data), "-U", self.user, "--auth=trust",
                  "-E", "UTF8", "--no-instructions", "-N")
        self.start()
        return self

    def _options(self) -> str:
        fsync = "on" if self.fsync else "off"
        return (f"-h {LOOPBACK} -p {self.port} -k {self.root} -c fsync={fsync}"
                " -c max_connections=200 -c shared_buffers=128MB")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-o", self._options(), "-l",
                  str(self.root / "server.log"), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`mode`: smart, fast or immediate)."""
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop",
                  check=False)

    def restart(self, mode: str = "fast") -> None:
        """pg_ctl restart: every connection is cut, the server comes back on the same port."""
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-o", self._options(),
                  "-l", str(self.root / "server.log"), "-w", "-t", "60", "restart")

    def url(self, database: str = "postgres") -> str:
        """The store URL of `database` in this cluster."""
        return f"postgresql://{self.user}@{LOOPBACK}:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run `statement` with psql; its output (unaligned, tuples only)."""
        done = self._run(_pg_bin("psql"), "-h", LOOPBACK, "-p", str(self.port), "-U",
                         self.user, "-d", database, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                         "-c", statement)
        return done.stdout.strip()

    def create_database(self) -> str:
        """A new empty database; its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name)


class RedisServer:
    """One redis-server on 127.0.0.1:`port`, without persistence; `kill` and `start` again
    keep the port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        """Start the server and wait until it answers."""
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(exe):
            raise RuntimeError(f"redis-server not found — {MISSING}")
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "redis.log", "ab")  # noqa: SIM115 - kept for the child
        self.process = subprocess.Popen(
            [exe, "--bind", LOOPBACK, "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.root), "--protected-mode", "yes"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), \
                    socket.create_connection((LOOPBACK, self.port), 1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return self
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.root / 'redis.log').read_text()}")
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer within 30 s")

    def kill(self) -> None:
        """SIGKILL the server (an outage)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def url(self, db: int = 0) -> str:
        """The side-store URL of database `db` in this server."""
        return f"redis://{LOOPBACK}:{self.port}/{db}"
