"""pulse as an MCP server (docs/mcp.md): the agent's tools, bound to the agent the home's
config.json names, never to who the caller says it is."""

from pulse_adapters.mcp._server import CALL_REFUSED, CallRefused, PulseMcp
from pulse_adapters.mcp._settings import McpSettings, McpSettingsError, load_settings
from pulse_core import publish_face

__all__ = [
    "CALL_REFUSED",
    "CallRefused",
    "McpSettings",
    "McpSettingsError",
    "PulseMcp",
    "load_settings",
]

publish_face(__name__)
