"""A tiny host for testing the agents package itself: `ScriptRun` effects run by
`ScriptExecutor`, which starts a Python script (`stand_in.py`) that writes NDJSON and fails
on demand: the prompt names the behaviour."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import psutil

from pulse_adapters.agents import (
    AgentOutputError,
    AgentResult,
    AgentRun,
    AgentRunExecutor,
    AgentStream,
    DispatchPolicy,
    Program,
    ProgramCheck,
    StreamLimits,
)
from pulse_core import Effect

STAND_IN = Path(__file__).with_name("stand_in.py")


class ScriptRun(AgentRun, tag="script-run"):
    """A run of the stand-in script."""


def python_check() -> ProgramCheck:
    """The check of this interpreter as the host's program."""
    return ProgramCheck(Program(field="layers.script.program", argv0=sys.executable,
                                min_version="3.11"), name="script-program")


class ScriptExecutor(AgentRunExecutor):
    """Runs the stand-in with the run's prompt as its behaviour; `pids` is where the script
    writes its own pid and its child's."""

    handles: ClassVar[tuple[type[Effect], ...]] = (ScriptRun,)

    def __init__(self, pids: Path, *, policy: DispatchPolicy | None = None,
                 run_timeout_s: float = 20.0, check: ProgramCheck | None = None,
                 limits: StreamLimits | None = None) -> None:
        super().__init__(check or python_check(), policy=policy, run_timeout_s=run_timeout_s,
                         limits=limits or StreamLimits(kill_grace_s=0.3))
        self.pids = pids

    def argv(self, run: AgentRun, program: str) -> Sequence[str]:
        return [program, str(STAND_IN), run.prompt, run.task_id]

    def env(self, run: AgentRun) -> Mapping[str, str]:
        return {"STAND_IN_PIDS": str(self.pids)}

    def parse(self, run: AgentRun, stream: AgentStream) -> AgentResult:
        events = stream.json_lines()
        final = [e for e in events if e.get("type") == "result"]
        if not final:
            raise AgentOutputError("no result event in the stream")
        last = final[-1]
        if last.get("is_error"):
            return AgentResult(ok=False, error=str(last.get("result")))
        return AgentResult(result=last.get("result"), session=last.get("session_id"))


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie waiting to be reaped counts)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _read_pids(path: Path) -> tuple[int, int] | None:
    text = path.read_text() if path.exists() else ""
    if not text.endswith("\n"):
        return None
    leader, child = text.split()
    return int(leader), int(child)


async def stand_in_pids(path: Path) -> tuple[int, int]:
    """The pids a hanging stand-in wrote to `path` (its own, its child's), once written."""
    for _ in range(1000):
        found = await asyncio.to_thread(_read_pids, path)
        if found is not None:
            return found
        await asyncio.sleep(0.01)
    raise AssertionError(f"the stand-in never wrote {path}")
