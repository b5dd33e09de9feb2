"""The real Hermes, privately: a HOME and HERMES_HOME under tmp_path, its config.yaml pointing
at a ChatServer on 127.0.0.1, and helpers to run `hermes` and read a pulse home back."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from pulse_adapters.llm.stand_in import ChatServer
from pulse_core import Event, open_home
from pulse_core.store import reveal
from tests.agent_programs import hermes_program

UPULSE = Path(sys.executable).parent / "upulse"


@dataclass(frozen=True)
class HermesRig:
    """A private Hermes: `home` is HOME, `hermes_home` HERMES_HOME, `argv0` the program."""

    home: Path
    hermes_home: Path
    argv0: Path
    server: ChatServer

    def env(self, **extra: str) -> dict[str, str]:
        """The whole environment a hermes process gets (nothing of the real one but PATH)."""
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home),
                "HERMES_HOME": str(self.hermes_home), "LANG": "C.UTF-8",
                "HERMES_DISABLE_LAZY_INSTALLS": "1", **extra}

    def run(self, *args: str, timeout: float = 120.0, **extra: str
            ) -> tuple[subprocess.CompletedProcess[str], float]:
        """Run `hermes *args`: what it did, and its wall time in seconds."""
        started = time.perf_counter()
        done = subprocess.run([str(self.argv0), *args], env=self.env(**extra),
                              capture_output=True, text=True, timeout=timeout, check=False,
                              cwd=self.home, stdin=subprocess.DEVNULL)
        return done, time.perf_counter() - started


def hermes_rig(tmp_path: Path, server: ChatServer, *, model: bool = True,
               plugin: bool = False) -> HermesRig:
    """Hermes configured (config.yaml, the keys `hermes config set` writes) to use `server`
    as its model when `model`, with the pulse plugin enabled when `plugin`; one attempt per
    model call (agent.api_max_retries: 1), no runtime pip installs, no tirith scanner (absent
    here, which `hermes chat` would report on stdout)."""
    home = tmp_path / "home"
    hermes_home = home / ".hermes"
    hermes_home.mkdir(parents=True)
    lines = ["agent:", "  api_max_retries: 1", "security:", "  allow_lazy_installs: false",
             "  tirith_enabled: false"]
    if model:
        lines += ["model:", "  provider: custom", f"  base_url: {server.base_url}",
                  "  default: stand-in", "  api_key: x"]
    if plugin:
        lines += ["plugins:", "  enabled:", "    - pulse"]
    (hermes_home / "config.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return HermesRig(home, hermes_home, hermes_program().argv0, server)


def upulse(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real `upulse --home HOME ...`."""
    return subprocess.run([str(UPULSE), "--home", str(home), *args], capture_output=True,
                          text=True, timeout=120, check=True, stdin=subprocess.DEVNULL)


async def read_events(home: Path, **filters: Any) -> list[Event]:
    """The events of the pulse home at `home` (opened as the CLI does, without the lock),
    their sealed memory text opened with the home's keys."""
    stores = await open_home(home)
    try:
        return [msgspec.structs.replace(e, data=reveal(e.data, stores.events.keys))
                for e in await stores.events.read(**filters)]
    finally:
        await stores.close()


def chat_requests(server: ChatServer) -> list[Any]:
    """The bodies of the chat-completion requests the server received."""
    return [r.json() for r in server.requests if r.path.endswith("/chat/completions")]


async def eventually(check: Callable[[], Awaitable[bool]], limit_s: float = 60.0) -> None:
    """Wait until `check()` holds (`limit_s` only ends a hang)."""
    async with asyncio.timeout(limit_s):
        while not await check():  # noqa: ASYNC110 - the engine and Hermes run on their own
            await asyncio.sleep(0.05)
