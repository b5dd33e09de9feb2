"""The cursor layer's run effect and its executor: how one task becomes one `agent -p` run.

Spawning, the timeout, killing the process group, the transcript and the task's transitions
are the shared AgentRunExecutor's; this module says only the command line, the folder and
what the output means.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pulse_adapters.agents import (
    AgentResult,
    AgentRun,
    AgentRunExecutor,
    AgentStream,
    ProgramCheck,
)
from pulse_adapters.cursor._settings import FIELD, CursorSettings, CursorSettingsError
from pulse_adapters.cursor._stream import parse_stream


class CursorRun(AgentRun, tag="cursor-run"):
    """Run a task on a Cursor agent (`agent -p` in the agent's repository folder)."""


class CursorExecutor(AgentRunExecutor):
    """Runs CursorRun effects: `<program> -p --output-format stream-json [--model M]
    [extra_args...] PROMPT` in the agent's `repo`, parsed as stream-json."""

    handles = (CursorRun,)

    def __init__(self, settings: CursorSettings, program: ProgramCheck) -> None:
        super().__init__(program, policy=settings.policy, run_timeout_s=settings.run_timeout_s)
        self.settings = settings

    def argv(self, run: AgentRun, program: str) -> Sequence[str]:
        model = () if self.settings.model is None else ("--model", self.settings.model)
        # The prompt is the last positional argument; one that starts with "-" would be read
        # as an option, so it gets a leading space (the model reads the same words).
        prompt = f" {run.prompt}" if run.prompt.startswith("-") else run.prompt
        return [program, "-p", "--output-format", "stream-json", *model,
                *self.settings.extra_args, prompt]

    def cwd(self, run: AgentRun) -> Path:
        agent = self.settings.agent(run.agent)
        if agent is None:  # dispatched under settings that named an agent since removed
            known = ", ".join(a.name for a in self.settings.agents)
            raise CursorSettingsError(f"{FIELD}.agents has no agent {run.agent!r} (it has "
                                      f"{known}) — the task goes back to the queue")
        return agent.folder

    def parse(self, run: AgentRun, stream: AgentStream) -> AgentResult:
        return parse_stream(stream)
