"""The pulse plugin for Hermes Agent: `register(ctx)` opens pulse in Hermes' process and
registers the plugin's hooks. Hermes loads the entry point `pulse` in the group
`hermes_agent.plugins` (`pulse_cli.hermes_plugin`, which reads the pulse home's config.json
and calls this `register`) once, at plugin discovery, when `plugins.enabled` in Hermes'
config.yaml lists `pulse` (`hermes plugins enable pulse`). See docs/hermes.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pulse_adapters.hermes._plugin import HermesPlugin, PluginHome, plugin_from_hermes

log = logging.getLogger("pulse.hermes")

__all__ = ["HermesPlugin", "PluginHome", "register"]


def register(ctx: Any, *, home: Callable[[Path], PluginHome] | None = None) -> None:
    """Open pulse on its own thread and register the plugin's hooks on Hermes' `ctx`
    (hermes_cli.plugins.PluginContext); `home` reads what the pulse home's configuration
    says (its store URLs, its import origins; the entry point Hermes loads,
    `pulse_cli.hermes_plugin`, reads config.json). Never raises: a plugin that cannot
    start is logged and Hermes runs on without it."""
    try:
        plugin_from_hermes(home=home).register(ctx)
    except Exception as exc:
        log.error("pulse plugin: not started: %s: %s", type(exc).__name__, exc)
