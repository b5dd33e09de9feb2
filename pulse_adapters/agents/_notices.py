"""What an agent host may tell the agent about an effect it is notified of."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HIDDEN = frozenset({"type", "env"})


def notice_fields(effect: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a stored effect (`event.data["effect"]`) a notice may show: never its
    `type` (the notice names it) or an `env` (a restart's environment may hold credentials).
    Callers cut URLs in what they make of them (`pulse_core.redact_urls`)."""
    return {k: v for k, v in effect.items() if k not in HIDDEN}
