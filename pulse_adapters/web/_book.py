"""What the UI keeps folded from the log as it grows: every effect (finished ones included)
and the recent survival decisions. It reads only what was appended since its last read, in
bounded pages, yielding to the loop between them, so a long log never stalls a tick."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from pulse_core import EffectEntry, Event, EventStore, fold_effect

PAGE = 2_000
SURVIVAL_KEPT = 50
EFFECT_KINDS = ("effect", "effect-executing", "effect-acked", "effect-failed",
                "effect-cancelled", "effect-retried", "quarantined")


class LogBook:
    """Every effect's entry and the last SURVIVAL_KEPT survival decisions (effects and marks
    of the types `catch_up` is told the survival layer makes), kept current by `catch_up`."""

    def __init__(self, events: EventStore) -> None:
        self.events = events
        self.survival_tags: frozenset[str] = frozenset()
        self.effects: dict[str, EffectEntry] = {}
        self.survival: deque[dict[str, Any]] = deque(maxlen=SURVIVAL_KEPT)
        self.seq = 0
        self._lock = asyncio.Lock()

    async def catch_up(self, survival_tags: frozenset[str] | None = None) -> None:
        """Fold what was appended since the last call (`survival_tags`: the survival layer's
        effect and mark types, when known)."""
        async with self._lock:
            if survival_tags:
                self.survival_tags = survival_tags
            while True:
                page = await self.events.read_page(self.seq, limit=PAGE)
                for event in page.events:
                    self._fold(event)
                self.seq = max(self.seq, page.last_seq if len(page.events) < PAGE
                               else page.events[-1].seq)
                if len(page.events) < PAGE:
                    return
                await asyncio.sleep(0)

    def _fold(self, event: Event) -> None:
        if event.kind in EFFECT_KINDS:
            folded = fold_effect(self.effects.get(event.key), event)
            if folded is not None:
                self.effects[event.key] = folded
        tag = _tag(event)
        if tag in self.survival_tags:
            self.survival.append({"seq": event.seq, "ts": event.ts, "kind": event.kind,
                                  "type": tag, "key": event.key, "body": _body(event)})


def _body(event: Event) -> Any:
    data = event.data if isinstance(event.data, dict) else {}
    return data.get("effect") if event.kind == "effect" else data.get("mark")


def _tag(event: Event) -> str | None:
    if event.kind not in ("effect", "mark"):
        return None
    body = _body(event)
    tag = body.get("type") if isinstance(body, dict) else None
    return tag if isinstance(tag, str) else None
