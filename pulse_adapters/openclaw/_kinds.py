"""The event kinds the openclaw layer writes, in the catalogue with their payloads."""

from __future__ import annotations

import msgspec

from pulse_core import register_kind

NOTICE_DELIVERED = "openclaw-notice-delivered"
NOTICE_FAILED = "openclaw-notice-failed"
NOTICE_QUEUED = "openclaw-notice-queued"
TRANSCRIPT_READ = "openclaw-transcript-read"
TRANSCRIPT_MALFORMED = "openclaw-transcript-malformed"


def notice_key(effect_id: str) -> str:
    """The key of an effect's delivery record: appended at version 0, so once per effect."""
    return f"openclaw-notice:{effect_id}"


def notice_label(effect_id: str) -> str:
    """The label a notice carries in the transcript (OpenClaw shows it as `[label]`)."""
    return f"pulse:{effect_id}"


def transcript_key(agent: str, session_id: str) -> str:
    """The key of one transcript session's ingest cursor."""
    return f"openclaw-transcript:{agent}:{session_id}"


class NoticeDelivered(msgspec.Struct, frozen=True, kw_only=True):
    """openclaw-notice-delivered: effect `effect_id` (event #`seq`) reached the model of
    session `session_key` (`recovered`: known from a turn in the transcript after the gateway
    that held it restarted); every chosen effect up to seq `through` is settled."""

    effect_id: str
    seq: int
    tag: str
    session_key: str
    message_id: str | None = None
    recovered: bool = False
    through: int | None = None


class NoticeQueued(msgspec.Struct, frozen=True, kw_only=True):
    """openclaw-notice-queued: effect `effect_id` was queued as a system event of session
    `session_key` in the gateway process `gateway_pid` (in its memory: a restart loses it, and
    it is queued again) while the session's transcript held `turns` entries."""

    effect_id: str
    session_key: str
    gateway_pid: int | None = None
    turns: int | None = None


class NoticeFailed(msgspec.Struct, frozen=True, kw_only=True):
    """openclaw-notice-failed: one delivery attempt failed; the next comes `retry_in_ms`
    later."""

    effect_id: str
    attempt: int
    error: str
    retry_in_ms: int


class TranscriptRead(msgspec.Struct, frozen=True, kw_only=True):
    """openclaw-transcript-read: session `session_id` is ingested up to row `seq`."""

    agent: str
    session_id: str
    seq: int
    messages: int = 0


class TranscriptMalformed(msgspec.Struct, frozen=True, kw_only=True):
    """openclaw-transcript-malformed: row `seq` of a session could not be read as a
    transcript entry and was skipped (`excerpt`: its first 200 characters)."""

    agent: str
    session_id: str
    seq: int
    reason: str
    excerpt: str = ""


for _kind, _doc, _type in (
    (NOTICE_DELIVERED, "a pulse notice reached the OpenClaw agent's model (its queued system "
                       "event was consumed by a turn); key: "
                       "openclaw-notice:<effect id>, written once", NoticeDelivered),
    (NOTICE_QUEUED, "a pulse notice was queued as a system event in the OpenClaw gateway's "
                    "memory, for the agent's next model request; key: "
                    "openclaw-notice-attempt:<effect id>", NoticeQueued),
    (NOTICE_FAILED, "a notice delivery to OpenClaw failed and will be retried; key: "
                    "openclaw-notice-attempt:<effect id>", NoticeFailed),
    (TRANSCRIPT_READ, "OpenClaw transcript ingest cursor; key: "
                      "openclaw-transcript:<agent>:<session id>", TranscriptRead),
    (TRANSCRIPT_MALFORMED, "an OpenClaw transcript row that could not be read, skipped",
     TranscriptMalformed),
):
    register_kind(_kind, _doc, _type)
