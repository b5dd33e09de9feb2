"""`upulse mcp`: serve the agent's tools over MCP on stdio (docs/mcp.md).

The agent the server acts for comes from config.json's `mcp` section, never from the caller;
the home is opened with that agent's principal, so every write passes the home's checks.
"""

from __future__ import annotations

from pulse_adapters.mcp import PulseMcp, load_settings
from pulse_cli import config as config_file
from pulse_cli.home import Home
from pulse_core import Principal, open_home


async def serve(home: Home) -> int:
    """Serve MCP on stdin/stdout until the client closes it; McpSettingsError when the
    `mcp` section is missing or wrong."""
    cfg = config_file.load_or_default(home.readable().config)
    settings = load_settings(None if cfg.mcp is None else dict(cfg.mcp))
    stores = await open_home(home.root, store=cfg.store, side_store=cfg.side_store,
                             principal=Principal.agent(settings.agent, settings.channel))
    try:
        await PulseMcp(stores.events, settings).server.run_stdio_async()
    finally:
        await stores.close()
    return 0
