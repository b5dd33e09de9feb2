"""A real OpenClaw gateway for the openclaw layer's tests: a private HOME and state folder in
a temporary directory, a free port on 127.0.0.1, its model provider pointed at a loopback
stand-in, started the way the layer's essential restarts it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from pulse_adapters.llm.stand_in import ChatServer
from pulse_adapters.openclaw import gateway_essential, load_settings
from pulse_core import LayerContext, SystemClock
from tests.agent_programs import openclaw_program

START_LIMIT_S = 240.0
"""Bounds a hang only: a gateway starts in ~11 s alone, past 45 s on a loaded machine."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def openclaw_config(port: int, model: ChatServer, root: Path) -> dict[str, Any]:
    """OpenClaw's config: a local gateway without auth on `port`, one agent `main` whose only
    model is the stand-in, no heartbeats, no plugins, logs inside `root`, the workspace's
    pulse/MEMORY.md (pulse's session primer) loaded into each session's context."""
    return {
        "gateway": {"mode": "local", "bind": "loopback", "port": port,
                    "auth": {"mode": "none"}},
        "models": {"mode": "replace", "providers": {"standin": {
            "baseUrl": model.base_url, "apiKey": "not-a-secret", "api": "openai-completions",
            "models": [{"id": "stand-in", "name": "Stand-in", "reasoning": False,
                        "input": ["text"], "contextWindow": 32000, "maxTokens": 1024}]}}},
        "agents": {"defaults": {"model": {"primary": "standin/stand-in"}, "utilityModel": "",
                                "skipBootstrap": True, "workspace": str(root / "workspace"),
                                "heartbeat": {"every": "0m"}}},
        "logging": {"file": str(root / "state" / "logs" / "gateway.log")},
        "plugins": {"enabled": False},  # none is needed here, and the gateway starts sooner
        "hooks": {"internal": {"entries": {"bootstrap-extra-files": {  # pulse's primer file
            "enabled": True, "paths": ["pulse/MEMORY.md"]}}}},
    }


@dataclass
class Gateway:
    """A running gateway and what the layer needs to reach it."""

    root: Path
    home: Path  # the pulse home
    port: int
    env: dict[str, str]
    settings: dict[str, Any]
    model: ChatServer

    @property
    def pidfile(self) -> Path:
        return self.home / "run" / "openclaw-gateway.pid"

    def pid(self) -> int:
        return int(self.pidfile.read_text().split()[0])

    def openclaw(self, *args: str, timeout_s: float = 240) -> Any:
        """Run the openclaw CLI against this gateway; its JSON output."""
        done = subprocess.run([self.settings["program"], *args], env={**os.environ, **self.env},
                              capture_output=True, text=True, timeout=timeout_s, check=False,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, (args[:3], done.stdout[-500:], done.stderr[-500:])
        return json.loads(done.stdout[done.stdout.index("{"):])

    def history(self, session_key: str = "agent:main:main") -> list[dict[str, Any]]:
        """The session's messages as OpenClaw's own `chat.history` shows them."""
        found = self.openclaw("gateway", "call", "chat.history", "--json", "--port",
                              str(self.port), "--params",
                              json.dumps({"sessionKey": session_key, "limit": 200}))
        return list(found["messages"])

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            os.killpg(self.pid(), signal.SIGKILL)


def wait_healthy(port: int, limit_s: float = START_LIMIT_S) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    pytest.fail(f"the OpenClaw gateway on port {port} did not answer /health within "
                f"{limit_s:g} s")


def start_gateway(root: Path, model: ChatServer, more: dict[str, Any] | None = None
                  ) -> Gateway:
    """Write the config (with the top-level sections `more` beside the rig's), start the
    gateway as the layer's essential would, wait for /health."""
    program = openclaw_program()
    port = free_port()
    state = root / "state"
    state.mkdir(parents=True)
    (root / "home").mkdir()
    config = {**openclaw_config(port, model, root), **(more or {})}
    (state / "openclaw.json").write_text(json.dumps(config))
    env = {**program.env, "HOME": str(root / "home"), "OPENCLAW_STATE_DIR": str(state),
           "OPENCLAW_CONFIG_PATH": str(state / "openclaw.json"), "NO_COLOR": "1"}
    settings: dict[str, Any] = {"program": str(program.argv0), "env": env,
                                "gateway": {"port": port, "interval_s": 1.0}}
    home = root / "pulse"
    home.mkdir(mode=0o700)
    essential = gateway_essential(load_settings(settings), LayerContext(home, SystemClock()))
    log = (root / "gateway.log").open("ab")
    child = subprocess.Popen(list(essential.argv), env={**os.environ, **env},
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    log.close()
    gateway = Gateway(root, home, port, env, settings, model)
    gateway.pidfile.parent.mkdir(parents=True)
    gateway.pidfile.write_text(f"{child.pid}\n")
    wait_healthy(port)
    return gateway


async def eventually(check: Callable[[], Awaitable[bool]], limit_s: float = 120.0) -> None:
    """Wait until `check()` holds (`limit_s` only ends a hang)."""
    async with asyncio.timeout(limit_s):
        while not await check():  # noqa: ASYNC110 - the engine and gateway run on their own
            await asyncio.sleep(0.1)
