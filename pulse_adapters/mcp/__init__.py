"""pulse as an MCP server (docs/mcp.md): the agent's tools, bound to the agent the home's
config.json names, never to who the caller says it is; on stdio, or over streamable HTTP on
127.0.0.1 behind the web UI's token (serve_http)."""

from pulse_adapters.mcp._calls import CALL_REFUSED, CallRefused
from pulse_adapters.mcp._commitments import CommitmentTools
from pulse_adapters.mcp._http import (
    HTTP_PORT,
    REQUEST_REFUSED,
    BearerGate,
    McpPortUnavailable,
    RequestRefused,
    serve_http,
)
from pulse_adapters.mcp._notices import NOTICE_ACKED, NoticeAcked, NoticeTools
from pulse_adapters.mcp._server import PulseMcp
from pulse_adapters.mcp._settings import McpSettings, McpSettingsError, load_settings
from pulse_adapters.mcp._watches import WatchTools
from pulse_core import publish_face

__all__ = [
    "CALL_REFUSED",
    "HTTP_PORT",
    "NOTICE_ACKED",
    "REQUEST_REFUSED",
    "BearerGate",
    "CallRefused",
    "CommitmentTools",
    "McpPortUnavailable",
    "McpSettings",
    "McpSettingsError",
    "NoticeAcked",
    "NoticeTools",
    "PulseMcp",
    "RequestRefused",
    "WatchTools",
    "load_settings",
    "serve_http",
]

publish_face(__name__)
