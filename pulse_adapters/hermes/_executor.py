"""HermesRun: one pulse task run as `hermes --oneshot=PROMPT`, on the shared AgentRunExecutor.

Hermes' one-shot mode prints only the final response and exits 0 even when every model call
failed (the response is then the error text), so a run also asks for Hermes' usage report
(`--usage-file`), whose `failed` and `completed` say how the run really went, and whose
`session_id` names the session in Hermes' store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pulse_adapters.agents import (
    AgentOutputError,
    AgentResult,
    AgentRun,
    AgentRunExecutor,
    AgentStream,
    ProgramCheck,
    StreamLimits,
)
from pulse_adapters.hermes._settings import HermesSettings
from pulse_core import HomeLayout


class HermesRun(AgentRun, tag="hermes-run"):
    """Run task `task_id` on the Hermes agent `agent` (`hermes --oneshot=PROMPT`)."""


class HermesRunExecutor(AgentRunExecutor):
    """Runs HermesRun effects with the layer's settings; `pulse_home` is the engine's home,
    which the run's pulse plugin (when Hermes has it enabled) records into as a client,
    without offering notices: a task's run is not the agent's conversation."""

    handles = (HermesRun,)

    def __init__(self, program: ProgramCheck, settings: HermesSettings, pulse_home: Path, *,
                 limits: StreamLimits | None = None) -> None:
        super().__init__(program, policy=settings.policy, run_timeout_s=settings.run_timeout_s,
                         limits=limits)
        self.settings = settings
        self.pulse_home = pulse_home
        self.reports = HomeLayout.at(pulse_home).logs / "hermes-runs"

    def usage_file(self, run: AgentRun) -> Path:
        """Where the run's Hermes usage report is written."""
        name = hashlib.sha256(run.dedup_key().encode()).hexdigest()[:20]
        return self.reports / f"{name}.json"

    def argv(self, run: AgentRun, program: str) -> Sequence[str]:
        if not run.prompt.strip():
            raise ValueError(f"task {run.task_id!r} has no prompt to give Hermes — create it "
                             "with `upulse task create ID --title ... --prompt ...`")
        self.reports.mkdir(parents=True, exist_ok=True)
        report = self.usage_file(run)
        report.unlink(missing_ok=True)
        toolsets = ("-t", self.settings.toolsets) if self.settings.toolsets else ()
        # --oneshot=PROMPT: a prompt that starts with "-" is still the prompt
        return (program, f"--oneshot={run.prompt}", "--usage-file", str(report), *toolsets,
                *self.settings.extra_args)

    def cwd(self, run: AgentRun) -> str | Path | None:
        return None if self.settings.workdir is None else Path(self.settings.workdir).expanduser()

    def env(self, run: AgentRun) -> Mapping[str, str]:
        return {"PULSE_HOME": str(self.pulse_home), "PULSE_HERMES_EMBED": "0",
                "PULSE_HERMES_NOTICES": "0", "PULSE_HERMES_TASK": run.task_id,
                **self.settings.model.run_env(), **self.settings.hermes_env()}

    def secrets(self, run: AgentRun) -> Sequence[str]:
        key = self.settings.model.api_key()
        return () if key is None else (key,)

    def parse(self, run: AgentRun, stream: AgentStream) -> AgentResult:
        def scrub(text: str) -> str:
            return self.redact(run, text)

        response = scrub("\n".join(stream.lines).strip())
        usage = json.loads(scrub(json.dumps(self._usage(run))))
        session = usage.get("session_id")
        session = session if isinstance(session, str) else None
        if usage.get("failed") or usage.get("completed") is False:
            why = usage.get("failure") or response or "no reason given"
            return AgentResult(ok=False, session=session,
                               error=f"Hermes reports the run failed: {scrub(str(why))[:500]}")
        if not response:
            raise AgentOutputError("hermes printed no response on stdout")
        return AgentResult(result={"response": response, "usage": usage}, session=session)

    def _usage(self, run: AgentRun) -> dict[str, Any]:
        report = self.usage_file(run)
        try:
            usage = json.loads(report.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise AgentOutputError(f"hermes wrote no usage report at {report} (is it "
                                   "hermes-agent 0.19.0 or newer?)") from None
        except (OSError, ValueError) as exc:
            raise AgentOutputError(f"hermes' usage report {report} is unreadable: {exc}"
                                   ) from None
        finally:
            report.unlink(missing_ok=True)
        if not isinstance(usage, dict):
            raise AgentOutputError(f"hermes' usage report {report} is not a JSON object")
        return usage

