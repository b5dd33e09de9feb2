"""The pulse plugin for Hermes Agent: entry point `pulse` in the group `hermes_agent.plugins`,
which Hermes imports as a module and whose `register(ctx)` it calls once, at plugin
discovery, when `plugins.enabled` in Hermes' config.yaml lists `pulse`
(`hermes plugins enable pulse`). See docs/hermes.md.
"""

from __future__ import annotations

import logging
from typing import Any

from pulse_adapters.hermes._plugin import HermesPlugin, plugin_from_hermes

log = logging.getLogger("pulse.hermes")

__all__ = ["HermesPlugin", "register"]


def register(ctx: Any) -> None:
    """Open pulse on its own thread and register the plugin's hooks on Hermes' `ctx`
    (hermes_cli.plugins.PluginContext). Never raises: a plugin that cannot start is logged
    and Hermes runs on without it."""
    try:
        plugin_from_hermes().register(ctx)
    except Exception as exc:
        log.error("pulse plugin: not started: %s: %s", type(exc).__name__, exc)
