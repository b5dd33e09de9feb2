"""The `mcp` section of a home's config.json: who the MCP server's caller is."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from pulse_core import LayerError

_NAME = msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z0-9_.-]+$")


class McpSettingsError(LayerError):
    """The `mcp` section of config.json is missing or wrong; the message names the field."""


class McpSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The agent every call of this server acts as (`agent`, its principal's name), the
    channel its writes name (`channel`), the largest text a call may carry (`max_text`,
    characters) and how many calls a minute it may make (`calls_per_minute`)."""

    agent: Annotated[str, _NAME]
    channel: Annotated[str, _NAME] = "mcp"
    max_text: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 4_000
    calls_per_minute: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 60


def load_settings(raw: Any) -> McpSettings:
    """`raw` (config.json's `mcp` value) as McpSettings; McpSettingsError naming the field
    when it is absent (null) or wrong."""
    if raw is None:
        raise McpSettingsError(
            "config.json has no `mcp` section — set \"mcp\": {\"agent\": \"NAME\"} to name "
            "the agent this server acts for (docs/mcp.md)")
    try:
        return msgspec.convert(raw, McpSettings)
    except msgspec.ValidationError as exc:
        raise McpSettingsError(f"config.json `mcp`: {exc} (docs/mcp.md lists the fields)"
                               ) from None
