"""`upulse` as a real subprocess on throwaway homes, for the CLI tests (daemons, queries)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from tests.timing import past_the_newest

ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 30


class Upulse:
    """Runs `python -m pulse_cli ARGS` with HOME and UPULSE_HOME inside the test's tmp_path."""

    def __init__(self, tmp_path: Path) -> None:
        self.base = tmp_path / "base"
        self.env = {
            **os.environ,
            "HOME": str(tmp_path),
            "UPULSE_HOME": str(self.base),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")])),
        }
        self.homes: list[Path] = []

    def __call__(self, *args: str | Path, ok: bool = True, timeout: float = CLI_TIMEOUT_S
                 ) -> subprocess.CompletedProcess[str]:
        """Run one command; with `ok`, fail the test unless it exits 0."""
        done = subprocess.run(
            [sys.executable, "-m", "pulse_cli", *map(str, args)], env=self.env,
            capture_output=True, text=True, timeout=timeout, check=False,
            stdin=subprocess.DEVNULL,
        )
        if ok and done.returncode != 0:
            raise AssertionError(f"upulse {' '.join(map(str, args))} exited "
                                 f"{done.returncode}\nstdout:\n{done.stdout}\n"
                                 f"stderr:\n{done.stderr}")
        return done

    def json(self, *args: str | Path) -> object:
        """Run a command with --json and decode its output."""
        return json.loads(self(*args, "--json").stdout)

    def init(self, home: Path, tick_ms: int = 200) -> Path:
        """`upulse init --home HOME` with a fast tick; the home's daemon is stopped at teardown."""
        self.homes.append(home)
        self("init", "--home", home)
        config = json.loads((home / "config.json").read_text())
        config["default_tick_ms"] = tick_ms
        config["daemon"]["drain_timeout_s"] = 3
        (home / "config.json").write_text(json.dumps(config))
        return home

    def stop_all(self) -> None:
        """Stop every daemon of the homes this test used; SIGKILL one that does not stop."""
        for home in [*self.homes, *sorted((self.base / "instances").glob("*")), self.base]:
            if daemon_pid(home) is None:
                continue
            self("daemon", "stop", "--home", home, "--timeout", "10", ok=False)
            left = daemon_pid(home)
            if left is not None:
                os.kill(left, signal.SIGKILL)


def daemon_pid(home: Path) -> int | None:
    """The pid in HOME/daemon.pid if that process is alive (not a zombie), else None."""
    try:
        pid = int((home / "daemon.pid").read_text())
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return None
    except (OSError, ValueError, psutil.NoSuchProcess):
        return None
    return pid


def wait_until(probe: Callable[[], object], timeout: float, what: str) -> object:
    """Poll `probe` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


async def agent_then_feed(home: Path, agent_text: str, feed_text: str) -> None:
    """ana's `city` as the agent said it, then her `home` as a news feed (`agent:rss:news`)
    said it: newer, so at equal authority the feed's ranks first."""
    from pulse_core import open_home
    from pulse_core.memory import MemoryBoard

    stores = await open_home(home)
    try:
        await MemoryBoard(stores.events).set_state("ana", "city", agent_text)
        await past_the_newest(stores.events)  # not in the same millisecond: that would tie
        await MemoryBoard(stores.events, origin="agent:rss:news").set_state(
            "ana", "home", feed_text)
    finally:
        await stores.close()


def name_import_origins(home: Path, *origins: str) -> None:
    """config.json's maintenance layer names `origins` as the writers of imported memory."""
    config = json.loads((home / "config.json").read_text())
    config.setdefault("layers", {})["maintenance"] = {"imports": {"origins": list(origins)}}
    (home / "config.json").write_text(json.dumps(config))
