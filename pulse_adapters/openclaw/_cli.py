"""OpenClaw's own CLI, run as a subprocess: gateway RPC calls and config reads, as JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pulse_core import PulseError

MAX_OUTPUT = 4 * 1024 * 1024


class OpenClawCommandFailed(PulseError):
    """An `openclaw` command failed, timed out, or printed no JSON; the message says which
    command (never its parameters, which may hold notice text) and what it printed last."""


def _last_json(text: str) -> Any:
    """The JSON document `text` ends with (the CLI may print warnings before it)."""
    start = text.find("{")
    while start != -1:
        with contextlib.suppress(ValueError):
            return json.loads(text[start:])
        start = text.find("{", start + 1)
    raise ValueError("no JSON object in the output")


class OpenClawCli:
    """Runs `program` with `env` set over the engine's environment, no shell, stdin closed.

    `call(method, params)` is `openclaw gateway call <method> --json --params <json> --port <port>`,
    OpenClaw's documented way to call a Gateway RPC method (credentials from its config).
    """

    def __init__(self, program: str, env: Mapping[str, str], *, port: int,
                 timeout_s: float = 60.0) -> None:
        self.program = program
        self.env = dict(env)
        self.port = port
        self.timeout_s = timeout_s

    async def run_json(self, args: Sequence[str], *, timeout_s: float | None = None) -> Any:
        """Run `openclaw *args` and return the JSON it printed; OpenClawCommandFailed when it
        exits non-zero, prints no JSON, or outlives `timeout_s`."""
        shown = " ".join(["openclaw", *args[:3]])
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            proc = await asyncio.create_subprocess_exec(
                self.program, *args, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **self.env}, limit=MAX_OUTPUT)
        except OSError as exc:
            raise OpenClawCommandFailed(f"`{shown}` could not start: {exc} — check "
                                        "layers.openclaw.program and layers.openclaw.env") from None
        try:
            async with asyncio.timeout(limit):
                out, err = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise OpenClawCommandFailed(f"`{shown}` gave no answer within {limit:g} s") from None
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        text = out.decode(errors="replace")
        try:
            found = _last_json(text)
        except ValueError:
            found = None
        if proc.returncode != 0 or found is None:
            if isinstance(found, dict) and "error" in found:
                said = json.dumps(found["error"])[:300]
            else:
                tail = err.decode(errors="replace").strip() or text.strip() or "no output"
                said = tail.splitlines()[-1][:300]
            raise OpenClawCommandFailed(f"`{shown}` exited with {proc.returncode}: {said}")
        return found

    async def call(self, method: str, params: Mapping[str, Any], *,
                   timeout_s: float | None = None) -> Any:
        """The result of Gateway RPC `method` called with `params`."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        result = await self.run_json(
            ["gateway", "call", method, "--json", "--params", json.dumps(dict(params)),
             "--port", str(self.port), "--timeout", str(int(limit * 1000))],
            timeout_s=limit + 15)
        if isinstance(result, dict) and result.get("ok") is False:
            raise OpenClawCommandFailed(f"gateway method {method} refused: "
                                        f"{json.dumps(result.get('error', result))[:300]}")
        return result

    async def config_get(self, path: str) -> Any:
        """`openclaw config get <path> --json` (secrets come back redacted)."""
        return await self.run_json(["config", "get", path, "--json"])
