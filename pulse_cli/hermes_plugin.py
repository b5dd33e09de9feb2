"""The pulse plugin for Hermes Agent as Hermes loads it: entry point `pulse` in the group
`hermes_agent.plugins`, a module whose `register(ctx)` Hermes calls once, at plugin
discovery, when `plugins.enabled` in Hermes' config.yaml lists `pulse`. It reads the pulse
home's config.json (its store URLs, the maintenance layer's import origins), so the plugin
writes into the log the home's daemon runs on, and hands the rest to
`pulse_adapters.hermes.plugin`. See docs/hermes.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pulse_adapters.hermes.plugin import PluginHome
from pulse_adapters.hermes.plugin import register as register_plugin
from pulse_cli import config as config_file
from pulse_cli.home import Home
from pulse_cli.maintenance import import_origins

__all__ = ["home_config", "register"]


def home_config(home: Path) -> PluginHome:
    """What `home`'s config.json tells the plugin (every default when it has none);
    ConfigError, or MaintenanceSettingsError, names what is wrong in it."""
    cfg = config_file.load_or_default(Home(home).config)
    return PluginHome(store=cfg.store, side_store=cfg.side_store,
                      import_origins=import_origins(cfg))


def register(ctx: Any) -> None:
    """Open pulse on its own thread, on the stores the home's config.json names, and
    register the plugin's hooks on Hermes' `ctx`. Never raises: a plugin that cannot start
    (a config.json that does not parse among the reasons) is logged and Hermes runs on
    without it."""
    register_plugin(ctx, home=home_config)
