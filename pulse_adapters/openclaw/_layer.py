"""The openclaw layer: every part built from one OpenClawSettings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pulse_adapters.agents import Program, ProgramCheck
from pulse_adapters.openclaw._cli import OpenClawCli
from pulse_adapters.openclaw._ingest import TranscriptIngest
from pulse_adapters.openclaw._notices import NoticeDelivery
from pulse_adapters.openclaw._primer import PrimerFile
from pulse_adapters.openclaw._settings import LAYER, MIN_VERSION, OpenClawSettings, load_settings
from pulse_adapters.openclaw._store import AgentStore
from pulse_adapters.openclaw._watchers import (
    GatewayHealthWatcher,
    ModelRouteWatcher,
    SessionStoreWatcher,
)
from pulse_core import Essential, Layer, LayerContext, Service, Watcher

GATEWAY = "openclaw-gateway"
"""The gateway's name as an essential process (vitals `process-alive`, restarts, notices)."""


def gateway_essential(settings: OpenClawSettings, context: LayerContext) -> Essential:
    """The gateway as the survival layer keeps it alive: `openclaw gateway run --port <port>
    <args...>` with the layer's `env`, found by its pidfile (or a match the settings give)."""
    gateway = settings.gateway
    pidfile = gateway.pidfile or str(context.home / "run" / f"{GATEWAY}.pid")
    return Essential(name=GATEWAY, argv=(settings.program, "gateway", "run", "--port",
                                         str(gateway.port), *gateway.args),
                     pidfile=pidfile, match_name=gateway.match_name,
                     match_cmdline=gateway.match_cmdline, env=dict(settings.env),
                     log=gateway.log)


@dataclass(frozen=True)
class OpenClaw:
    """The layer's parts, and `layer`, the Layer that runs them together."""

    settings: OpenClawSettings
    cli: OpenClawCli
    store: AgentStore
    program: ProgramCheck
    notices: NoticeDelivery
    transcripts: TranscriptIngest
    layer: Layer


def build_openclaw(settings: Any, context: LayerContext) -> OpenClaw:
    """Build the layer's parts from `settings` (OpenClawSettings, None, or config.json's
    object); OpenClawSettingsError names a wrong setting as `layers.openclaw.<field>`."""
    valid = load_settings(settings)
    cli = OpenClawCli(valid.program, valid.env, port=valid.gateway.port,
                      timeout_s=valid.cli_timeout_s)
    store = AgentStore(valid.resolved_state_dir(), valid.agent)
    program = ProgramCheck(Program(
        field=f"layers.{LAYER}.program", argv0=valid.program, min_version=MIN_VERSION,
        env=dict(valid.env), install_hint="npm install -g openclaw (it needs Node 24)"),
        name="openclaw-program")
    notices = NoticeDelivery(valid, cli, store, program)
    transcripts = TranscriptIngest(valid.transcripts, store)
    gateway = valid.gateway
    watchers: list[Watcher] = [
        GatewayHealthWatcher(gateway.port, interval_s=gateway.interval_s,
                             timeout_s=gateway.timeout_s),
        SessionStoreWatcher(store, interval_s=valid.sessions_interval_s)]
    if valid.model.probe:
        watchers.append(ModelRouteWatcher(valid.model, cli, valid.agent, context.clock))
    services: list[Service] = [program]
    if valid.notices.enabled:
        services.append(notices)
    if valid.transcripts.enabled:
        services.append(transcripts)
    if valid.primer.enabled:
        services.append(PrimerFile(valid))
    essentials = (gateway_essential(valid, context),) if gateway.keep_alive else ()
    bundle = Layer(LAYER, watchers=watchers, services=services, essentials=essentials)
    return OpenClaw(valid, cli, store, program, notices, transcripts, bundle)


def layer(settings: Any, context: LayerContext) -> Layer:
    """The openclaw layer (entry point `openclaw` in group `pulse.layers`): gateway health,
    model route and session-store watchers, the gateway as an essential process, notices for
    the agent's model, transcript ingest into memory, and the session primer in the
    workspace."""
    return build_openclaw(settings, context).layer
