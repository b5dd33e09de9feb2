"""Agent adapters' shared parts: who takes which task (AgentSpec, DispatchPolicy), the rule
that hands tasks out (TaskDispatcher), the effect that runs one (AgentRun), the one subprocess
executor every host's runs go through (AgentRunExecutor), the check of a host's program
(Program, check_program, ProgramCheck), and the page of a host's runs in the web UI
(agent_runs_page) with what it and `upulse runs` say of one run (run_view), and the one
notice text every host shows (notice_body, its sealed quotes opened by open_notice), quoted
text fenced as data (fence_untrusted)."""

from pulse_adapters.agents._dispatch import TaskDispatcher, plan_dispatch
from pulse_adapters.agents._effects import AgentRun, TaskTimedOut, timed_out_type
from pulse_adapters.agents._executor import AgentRunExecutor
from pulse_adapters.agents._feed import (
    AgentNoticesError,
    AgentNoticesRule,
    AgentNoticesSettings,
    NoticeSources,
    agent_notice,
    notices_layer,
)
from pulse_adapters.agents._notices import (
    NOTICE_MAX_CHARS,
    fence_untrusted,
    notice_body,
    notice_fields,
    open_notice,
)
from pulse_adapters.agents._page import AgentRunView, agent_runs_page, is_agent_run, run_view
from pulse_adapters.agents._process import StreamLimits
from pulse_adapters.agents._program import (
    Program,
    ProgramCheck,
    ProgramStatus,
    ProgramUnavailable,
    check_program,
)
from pulse_adapters.agents._spec import AgentSpec, DispatchPolicy
from pulse_adapters.agents._stream import AgentOutputError, AgentResult, AgentStream
from pulse_adapters.agents._trouble import StoreTrouble
from pulse_core import publish_face

__all__ = [
    "NOTICE_MAX_CHARS",
    "AgentNoticesError",
    "AgentNoticesRule",
    "AgentNoticesSettings",
    "AgentOutputError",
    "AgentResult",
    "AgentRun",
    "AgentRunExecutor",
    "AgentRunView",
    "AgentSpec",
    "AgentStream",
    "DispatchPolicy",
    "NoticeSources",
    "Program",
    "ProgramCheck",
    "ProgramStatus",
    "ProgramUnavailable",
    "StoreTrouble",
    "StreamLimits",
    "TaskDispatcher",
    "TaskTimedOut",
    "agent_notice",
    "agent_runs_page",
    "check_program",
    "fence_untrusted",
    "is_agent_run",
    "notice_body",
    "notice_fields",
    "notices_layer",
    "open_notice",
    "plan_dispatch",
    "run_view",
    "timed_out_type",
]

publish_face(__name__)
