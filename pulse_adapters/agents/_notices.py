"""What an agent host may tell the agent about an effect it is notified of."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HIDDEN = frozenset({"type", "env"})


def notice_fields(effect: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a stored effect (`event.data["effect"]`) a notice may show: never its
    `type` (the notice names it) or an `env` (a restart's environment may hold credentials).
    Callers cut every URL in the whole text they make of a notice, a notify's text too
    (`pulse_core.redact_urls`): paths, queries and user info hold webhook tokens."""
    return {k: v for k, v in effect.items() if k not in HIDDEN}
