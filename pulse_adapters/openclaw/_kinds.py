"""The event kinds the openclaw layer writes, in the catalogue with their payloads."""

from __future__ import annotations

import msgspec

from pulse_core import register_kind

NOTICE_DELIVERED = "openclaw-notice-delivered"
NOTICE_FAILED = "openclaw-notice-failed"
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
    """openclaw-notice-delivered: effect `effect_id` (event #`seq`) is in session
    `session_key` as transcript message `message_id` (None when a delivery that crashed
    before this record was found already there)."""

    effect_id: str
    seq: int
    tag: str
    session_key: str
    message_id: str | None = None
    recovered: bool = False


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
    (NOTICE_DELIVERED, "a pulse notice is in the OpenClaw agent's session; key: "
                       "openclaw-notice:<effect id>, written once", NoticeDelivered),
    (NOTICE_FAILED, "a notice delivery to OpenClaw failed and will be retried; key: "
                    "openclaw-notice-attempt:<effect id>", NoticeFailed),
    (TRANSCRIPT_READ, "OpenClaw transcript ingest cursor; key: "
                      "openclaw-transcript:<agent>:<session id>", TranscriptRead),
    (TRANSCRIPT_MALFORMED, "an OpenClaw transcript row that could not be read, skipped",
     TranscriptMalformed),
):
    register_kind(_kind, _doc, _type)
