"""How Hermes conversations land in pulse memory: whom an exchange is about, and the marker of
a session the plugin records live (so transcript ingest leaves that session alone)."""

from __future__ import annotations

from pulse_core import register_kind

SESSION_FOLLOWED = "hermes-session-followed"
ROLES = {"user": "human", "assistant": "agent"}
"""Hermes message roles and the pulse exchange roles they are remembered as."""

register_kind(SESSION_FOLLOWED, "the Hermes plugin records this session's exchanges as they "
              "happen (transcript ingest skips it); key: hermes-session:<session id>")


def session_key(session_id: str) -> str:
    """The event key of a Hermes session's marker."""
    return f"hermes-session:{session_id}"


def identity_of(platform: str, user: str | None, default: str) -> str:
    """Whom an exchange is about: the platform's user (`telegram:12345`), else `default`
    (a CLI session has no platform user)."""
    user = (user or "").strip()
    if not user:
        return default
    return f"{platform}:{user}" if platform and platform != "cli" else user
