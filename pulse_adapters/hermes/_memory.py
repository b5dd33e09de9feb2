"""How Hermes conversations land in pulse memory: whom an exchange is about, and who records a
session. The first event on a session's key `hermes-session:<id>`, appended at expected
version 0, decides, once: `hermes-session-followed` (the plugin records it live; transcript
ingest leaves it alone) or `hermes-session-ingested` (ingest took it first; the plugin
records none of it)."""

from __future__ import annotations

from pulse_core import EventStore, register_kind

SESSION_FOLLOWED = "hermes-session-followed"
SESSION_INGESTED = "hermes-session-ingested"
SUBAGENT = "subagent"
"""The platform (hooks' `platform`, a session's `source`) of an agent delegate_task started:
its user messages are the goal the parent agent wrote, not anything a human said."""
ROLES = {"user": "human", "assistant": "agent"}
"""Hermes message roles and the pulse exchange roles they are remembered as."""

register_kind(SESSION_FOLLOWED, "the Hermes plugin records this session's exchanges as they "
              "happen (transcript ingest skips it); key: hermes-session:<session id>")
register_kind(SESSION_INGESTED, "transcript ingest records this session from Hermes' store (the "
              "plugin records none of it); key: hermes-session:<session id>")


def session_key(session_id: str) -> str:
    """The event key of a Hermes session's marker."""
    return f"hermes-session:{session_id}"


async def session_recorder(events: EventStore, session_id: str) -> str | None:
    """The kind of the first event on the session's key: who records it (None: no one yet)."""
    first = await events.read(key=session_key(session_id), limit=1)
    return first[0].kind if first else None


def identity_of(platform: str, user: str | None, default: str) -> str:
    """Whom an exchange is about: the platform's user (`telegram:12345`), else `default`
    (a CLI session has no platform user)."""
    user = (user or "").strip()
    if not user:
        return default
    return f"{platform}:{user}" if platform and platform != "cli" else user
