"""Hermes Agent and pulse: the `hermes` layer (watch Hermes, run pulse tasks on it with
`hermes --oneshot`, remember its transcripts) and the Hermes plugin (pulse inside Hermes'
own process: `pulse_adapters.hermes.plugin`). See docs/hermes.md."""

from pulse_adapters.hermes._bridge import PulseBridge
from pulse_adapters.hermes._executor import HermesRun, HermesRunExecutor
from pulse_adapters.hermes._kanban import KanbanTransition
from pulse_adapters.hermes._layer import (
    HermesParts,
    build_hermes,
    gateway_essential,
    hermes_program,
    layer,
)
from pulse_adapters.hermes._notices import NoticeFollower
from pulse_adapters.hermes._plugin import HermesPlugin, PluginSettings, plugin_settings
from pulse_adapters.hermes._settings import (
    MIN_VERSION,
    HermesModel,
    HermesSettings,
    HermesSettingsError,
    load_settings,
)
from pulse_adapters.hermes._transcripts import TranscriptIngest
from pulse_adapters.hermes._watchers import HermesHomeWatcher, HermesRouteWatcher
from pulse_core import publish_face

__all__ = [
    "MIN_VERSION",
    "HermesHomeWatcher",
    "HermesModel",
    "HermesParts",
    "HermesPlugin",
    "HermesRouteWatcher",
    "HermesRun",
    "HermesRunExecutor",
    "HermesSettings",
    "HermesSettingsError",
    "KanbanTransition",
    "NoticeFollower",
    "PluginSettings",
    "PulseBridge",
    "TranscriptIngest",
    "build_hermes",
    "gateway_essential",
    "hermes_program",
    "layer",
    "load_settings",
    "plugin_settings",
]

publish_face(__name__)
