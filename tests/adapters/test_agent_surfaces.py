"""The agent adapters' public surfaces: pinned, documented, errors under PulseError, and
their implementation modules private."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from pulse_core import PulseError

SURFACES = {
    "pulse_adapters.agents": {
        "AgentOutputError", "AgentResult", "AgentRun", "AgentRunExecutor", "AgentRunView",
        "AgentSpec",
        "AgentStream", "DispatchPolicy", "Program", "ProgramCheck", "ProgramStatus",
        "ProgramUnavailable", "StoreTrouble", "StreamLimits", "TaskDispatcher", "TaskTimedOut",
        "NOTICE_MAX_CHARS", "agent_runs_page", "check_program", "fence_untrusted", "is_agent_run",
        "notice_body", "notice_fields", "open_notice", "plan_dispatch",
        "run_view", "timed_out_type",
        "AgentNoticesError", "AgentNoticesRule", "AgentNoticesSettings", "NoticeSources",
        "agent_notice", "notices_layer",
    },
    "pulse_adapters.cursor": {
        "CursorAgent", "CursorExecutor", "CursorLayer", "CursorOutcome", "CursorRun",
        "CursorSettings", "CursorSettingsError", "LAYER", "MIN_VERSION", "build_cursor",
        "layer", "load_settings", "parse_stream",
    },
    "pulse_adapters.hermes": {
        "HermesHomeWatcher", "HermesModel", "HermesParts", "HermesPlugin",
        "HermesRouteWatcher", "HermesRun", "HermesRunExecutor", "HermesSettings",
        "HermesSettingsError", "KanbanTransition", "MIN_VERSION", "NoticeFollower",
        "PluginSettings", "PulseBridge", "TranscriptIngest", "build_hermes",
        "gateway_essential", "hermes_program", "layer", "load_settings", "plugin_settings",
    },
    "pulse_adapters.openclaw": {
        "AgentStore", "GATEWAY", "GatewayHealthWatcher", "GatewaySettings", "LAYER",
        "MIN_VERSION", "ModelRouteWatcher", "ModelSettings", "NOTICE_DELIVERED",
        "NOTICE_FAILED", "NOTICE_QUEUED", "NoticeDelivered", "NoticeDelivery", "NoticeFailed",
        "NoticeQueued", "NoticeSettings", "PRIMER_WRITTEN", "PrimerFile", "PrimerSettings",
        "PrimerWritten", "OpenClaw", "OpenClawCli", "OpenClawCommandFailed", "OpenClawSettings",
        "OpenClawSettingsError", "RouteUnknown", "SessionStoreWatcher", "TRANSCRIPT_MALFORMED",
        "TRANSCRIPT_READ", "TranscriptIngest", "TranscriptMalformed", "TranscriptRead",
        "TranscriptRow", "TranscriptSettings", "build_openclaw", "gateway_essential", "layer",
        "load_settings", "message_of", "notice_key", "notice_label", "notice_text",
        "transcript_key",
    },
}


@pytest.mark.parametrize("package", sorted(SURFACES))
def test_the_public_surface_is_pinned_documented_and_typed(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == SURFACES[package]
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"{package}.{name} has no docstring"
        if inspect.isclass(obj) and issubclass(obj, Exception):
            assert issubclass(obj, PulseError), f"{package}.{name}"


@pytest.mark.parametrize("package", sorted(SURFACES))
def test_implementation_modules_are_private(package: str) -> None:
    module = importlib.import_module(package)
    public = [m.name for m in pkgutil.iter_modules(module.__path__)
              if not m.name.startswith("_") and m.name != "plugin"]  # Hermes' entry point
    assert public == [], f"{package} has public implementation modules: {public}"
