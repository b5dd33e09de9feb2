"""notify: an event for the agent, plus optional log-file and webhook sinks."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import msgspec

from pulse_core import (
    EventDraft,
    ExecutionContext,
    Executor,
    PulseError,
    redact_urls,
    register_kind,
)
from pulse_core.store import is_sealed
from pulse_survival.config import NotifySinks
from pulse_survival.effects import Notify
from pulse_survival.webhooks import sign_webhook

register_kind("notification", "a notice for the agent to read; key: topic")


class WebhookFailed(PulseError):
    """The notify webhook did not take a notice: it answered an HTTP error or could not be
    reached. The message names the webhook by scheme and host only, never its path, query
    or credentials (they often carry a token, and failures are stored for good)."""


SEALED_ELSEWHERE = "[memory text: sealed in pulse, shown to the agent only]"
"""What a log file or webhook gets for a quoted memory text sealed in the log (an overdue
commitment's words): the words would outlive a purge there."""


def outside(body: dict[str, Any]) -> dict[str, Any]:
    """`body` as sinks outside the log get it: each sealed quoted text replaced by
    SEALED_ELSEWHERE (marked `sealed`), so a purge of the element erases its words
    everywhere."""
    quoted = body.get("quoted")
    if not quoted or not any(is_sealed(q["text"]) for q in quoted):
        return body
    return {**body, "quoted": [{**q, "text": SEALED_ELSEWHERE, "sealed": True}
                               if is_sealed(q["text"]) else q for q in quoted]}


class NotifyExecutor(Executor):
    """Delivers a Notify to every sink: the `notification` event (always), then the log file
    and the webhook when configured (signed when a secret is set). A failing sink fails the
    attempt with its error (for the webhook a WebhookFailed naming its scheme and host only);
    a retry does not repeat the event (it is idempotent per effect)."""

    handles = (Notify,)
    timeout = 15.0
    max_attempts = 3

    def __init__(self, sinks: NotifySinks) -> None:
        self.sinks = sinks
        self.timeout = max(type(self).timeout, sinks.webhook_timeout_s + 10.0)

    async def execute(self, effect: Notify, ctx: ExecutionContext) -> dict[str, Any]:
        body: dict[str, Any] = {"topic": effect.topic, "level": effect.level, "text": effect.text,
                "effect": ctx.effect_id, "at": ctx.clock.now_ms()}
        if effect.quoted:  # passed on as data, each with its source
            body["quoted"] = [{"source": q.source, "text": q.text} for q in effect.quoted]
        delivered = ["event"]
        await ctx.events.append([EventDraft(
            "notification", effect.topic, {k: v for k, v in body.items() if k != "at"},
            origin="survival", cause=ctx.seq, idem=f"notification:{ctx.effect_id}")])
        body = outside(body)
        if self.sinks.log_file:
            line = msgspec.json.encode(body) + b"\n"
            await asyncio.to_thread(_append, Path(self.sinks.log_file), line)
            delivered.append("log")
        if self.sinks.webhook_url:
            headers = {"Content-Type": "application/json",
                       "Idempotency-Key": ctx.idempotency_key}
            content = msgspec.json.encode(body)
            if self.sinks.webhook_secret:
                headers |= sign_webhook(self.sinks.webhook_secret, ctx.effect_id,
                                        ctx.clock.now_ms() // 1000, content)
            await self._post(self.sinks.webhook_url, content, headers)
            delivered.append("webhook")
        return {"delivered": delivered}

    async def _post(self, url: str, content: bytes, headers: dict[str, str]) -> None:
        origin = webhook_origin(url)
        try:
            async with httpx.AsyncClient(timeout=self.sinks.webhook_timeout_s) as client:
                response = await client.post(url, content=content, headers=headers)
        except httpx.HTTPError as exc:
            # httpx's own messages may quote the URL: say only what kind of failure it was
            raise WebhookFailed(f"notify webhook {origin} could not be reached "
                                f"({type(exc).__name__}) — check that it is up and the URL "
                                "in survival.notify.webhook_url") from None
        if not response.is_success:
            raise WebhookFailed(f"notify webhook {origin} answered HTTP "
                                f"{response.status_code} {response.reason_phrase} — check "
                                "survival.notify.webhook_url and the receiving service")


def webhook_origin(url: str) -> str:
    """All a stored message may say of the webhook `url`: its scheme and host (with its
    port). Characters a URL may not hold unencoded (`{`, `|`, a space...) are encoded first,
    so no part of the path, query or user info is left beside the host."""
    return redact_urls(quote(url, safe=":/?#[]@%"))


class NotifyLogRefused(PulseError):
    """The notify log file is not a regular file this user can append to."""


def _append(path: Path, line: bytes) -> None:
    """Append `line` to the notify log file, created 0600; anything but a regular file (a
    FIFO would block the thread for good) is refused without waiting."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:  # ENXIO: a FIFO nobody reads
        raise NotifyLogRefused(f"notify log file {path} cannot be opened for appending "
                               f"({exc.strerror}) — point survival.notify.log_file at a "
                               "regular file") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotifyLogRefused(f"notify log file {path} is not a regular file — point "
                                   "survival.notify.log_file at a regular file")
        os.write(fd, line)
    finally:
        os.close(fd)
