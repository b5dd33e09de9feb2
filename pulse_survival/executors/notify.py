"""notify: an event for the agent, plus optional log-file and webhook sinks."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import msgspec

from pulse_core import EventDraft, ExecutionContext, Executor, register_kind
from pulse_survival.config import NotifySinks
from pulse_survival.effects import Notify

register_kind("notification", "a notice for the agent to read; key: topic")


class NotifyExecutor(Executor):
    """Delivers a Notify to every sink: the `notification` event (always), then the log file
    and the webhook when configured. A failing sink fails the attempt with its error; a retry
    does not repeat the event (it is idempotent per effect)."""

    handles = (Notify,)
    timeout = 15.0
    max_attempts = 3

    def __init__(self, sinks: NotifySinks) -> None:
        self.sinks = sinks

    async def execute(self, effect: Notify, ctx: ExecutionContext) -> dict[str, Any]:
        body = {"topic": effect.topic, "level": effect.level, "text": effect.text,
                "effect": ctx.effect_id, "at": ctx.clock.now_ms()}
        delivered = ["event"]
        await ctx.events.append([EventDraft(
            "notification", effect.topic, {k: v for k, v in body.items() if k != "at"},
            origin="survival", cause=ctx.seq, idem=f"notification:{ctx.effect_id}")])
        if self.sinks.log_file:
            line = msgspec.json.encode(body) + b"\n"
            await asyncio.to_thread(_append, Path(self.sinks.log_file), line)
            delivered.append("log")
        if self.sinks.webhook_url:
            async with httpx.AsyncClient(timeout=self.sinks.webhook_timeout_s) as client:
                response = await client.post(self.sinks.webhook_url, json=body,
                                             headers={"Idempotency-Key": ctx.idempotency_key})
                response.raise_for_status()
            delivered.append("webhook")
        return {"delivered": delivered}


def _append(path: Path, line: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as out:
        out.write(line)
