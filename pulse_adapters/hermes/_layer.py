"""The hermes layer: every part built from one HermesSettings.

The program check (a service: a missing or old `hermes` is an error event, never a stopped
engine), the dispatcher and executor of HermesRun when agents are configured, the watchers
of Hermes' home and model route, transcript ingest, and the gateway as an essential process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pulse_adapters.agents import Program, ProgramCheck, TaskDispatcher, agent_runs_page
from pulse_adapters.hermes._executor import HermesRun, HermesRunExecutor
from pulse_adapters.hermes._settings import FIELD, LAYER, MIN_VERSION, HermesSettings, load_settings
from pulse_adapters.hermes._transcripts import TranscriptIngest
from pulse_adapters.hermes._watchers import HermesHomeWatcher, route_watcher
from pulse_core import Essential, HomeLayout, Layer, LayerContext, Service, Watcher


def hermes_program(settings: HermesSettings) -> Program:
    """The check of `settings.program`: found, and at least MIN_VERSION by `hermes dump`
    (`hermes --version` asks PyPI whether an update exists; `dump` stays on this machine)."""
    return Program(field=f"{FIELD}.program", argv0=settings.program, min_version=MIN_VERSION,
                   version_argv=("dump",), env=settings.hermes_env(),
                   install_hint="pip install 'hermes-agent>=0.19.0'")


def gateway_essential(settings: HermesSettings, context: LayerContext) -> Essential:
    """`hermes gateway run --replace` as a process the survival layer keeps alive (never
    pip-installing a platform's package unless `lazy_installs`): the gateway of this
    layer's Hermes home, told from another home's by its HERMES_HOME (every gateway's
    command line is the same)."""
    home = {"HERMES_HOME": str(settings.hermes_home())}
    return Essential(name="hermes-gateway",
                     argv=(settings.program, "gateway", "run", "--replace"),
                     match_cmdline="hermes gateway run", match_env=home,
                     env={**settings.hermes_env(), **home},
                     log=str(HomeLayout.at(context.home).logs / "hermes-gateway.log"))


@dataclass(frozen=True)
class HermesParts:
    """The layer's parts, and `layer`, the Layer that runs them together."""

    settings: HermesSettings
    program: ProgramCheck
    executor: HermesRunExecutor
    dispatcher: TaskDispatcher | None
    ingest: TranscriptIngest | None
    layer: Layer


def build_hermes(settings: Any, context: LayerContext) -> HermesParts:
    """Build the layer from `settings` (HermesSettings, config.json's object, or None);
    HermesSettingsError names a wrong setting."""
    valid = load_settings(settings)
    home = valid.hermes_home()
    check = ProgramCheck(hermes_program(valid), name="hermes-program")
    executor = HermesRunExecutor(check, valid, context.home)
    dispatcher = (TaskDispatcher(HermesRun, valid.agents, valid.policy, program=check)
                  if valid.agents else None)
    ingest = (TranscriptIngest(home, identity=valid.identity,
                               interval_s=valid.ingest_interval_s) if valid.ingest else None)
    watchers: list[Watcher] = [HermesHomeWatcher(home, interval=valid.home_interval_s)]
    route = route_watcher(valid.model, context.clock)
    if route is not None:
        watchers.append(route)
    services: list[Service] = [check] if ingest is None else [check, ingest]
    bundle = Layer(LAYER, watchers=watchers, rules=() if dispatcher is None else (dispatcher,),
                   executors=(executor,), services=services,
                   essentials=(gateway_essential(valid, context),) if valid.gateway else (),
                   ui=(agent_runs_page(LAYER, "Hermes", HermesRun, valid.agents),)
                   if valid.agents else ())
    return HermesParts(valid, check, executor, dispatcher, ingest, bundle)


def layer(settings: Any, context: LayerContext) -> Layer:
    """The hermes layer (entry point `hermes` in group `pulse.layers`), built from
    `settings`."""
    return build_hermes(settings, context).layer
