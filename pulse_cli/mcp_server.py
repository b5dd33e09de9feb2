"""`upulse mcp`: serve the agent's tools over MCP, on stdio or, with --http, over streamable
HTTP on 127.0.0.1 behind the web UI's token (docs/mcp.md).

The agent the server acts for comes from config.json's `mcp` section, never from the caller;
the home is opened with that agent's principal, so every write passes the home's checks.
"""

from __future__ import annotations

import sys

from pulse_adapters.mcp import HTTP_PORT, PulseMcp, load_settings, serve_http
from pulse_adapters.web import read_token
from pulse_cli import config as config_file
from pulse_cli.home import Home
from pulse_cli.maintenance import import_origins
from pulse_core import Principal, open_home


async def serve(home: Home, http: bool = False, port: int | None = None) -> int:
    """Serve MCP on stdin/stdout until the client closes it, or with `http` on
    http://127.0.0.1:`port`/mcp (default HTTP_PORT, 8422) until SIGINT or SIGTERM;
    McpSettingsError when the `mcp` section is missing or wrong, TokenMissing when --http
    finds no UI token."""
    cfg = config_file.load_or_default(home.readable().config)
    settings = load_settings(None if cfg.mcp is None else dict(cfg.mcp))
    origins = import_origins(cfg)
    token = read_token(home.root) if http else ""
    stores = await open_home(home.root, store=cfg.store, side_store=cfg.side_store,
                             principal=Principal.agent(settings.agent, settings.channel))
    try:
        tools = PulseMcp(stores.events, settings, import_origins=origins)
        if http:
            await serve_http(tools.server.streamable_http_app(), token, tools.calls,
                             HTTP_PORT if port is None else port,
                             lambda url: print(f"upulse mcp: serving MCP on {url}",
                                               file=sys.stderr, flush=True))
        else:
            await tools.server.run_stdio_async()
    finally:
        await stores.close()
    return 0
