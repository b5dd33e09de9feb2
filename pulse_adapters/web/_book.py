"""What the UI keeps folded from the log as it grows: the effects the Effects page lists, how
many effects are in each state, and the recent survival decisions. It reads only the kinds it
folds, only what was appended since its last read, in bounded pages, yielding between them.

Kept whole: every unfinished effect, every finally failed or cancelled one (what an operator
acts on), and the newest ACKED_KEPT acked ones; older acked effects are only counted.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from pulse_adapters.web._folding import LogFold
from pulse_core import (
    EFFECT_KINDS,
    MARK_KIND,
    QUARANTINED,
    EffectEntry,
    EffectStatus,
    EngineInstance,
    Event,
    EventStore,
    FleetFold,
    fold_effect,
)

SURVIVAL_KEPT = 50
ACKED_KEPT = 1_000
KINDS = sorted(EFFECT_KINDS | {MARK_KIND, QUARANTINED})


class LogBook(LogFold):
    """The effects and survival decisions the UI shows (see the module's docstring), kept
    current by `catch_up`."""

    kinds = KINDS

    def __init__(self, events: EventStore) -> None:
        super().__init__(events)
        self.survival_tags: frozenset[str] = frozenset()
        self.effects: dict[str, EffectEntry] = {}
        self.counts: Counter[str] = Counter()
        self.survival: deque[dict[str, Any]] = deque(maxlen=SURVIVAL_KEPT)
        self.attempt_started: dict[str, int] = {}
        """When each kept effect's last attempt began (ms): the ts of its last claim."""
        self.last_seq: dict[str, int] = {}
        """The seq of each kept effect's newest event: the one that put it in its state."""
        self._acked: deque[str] = deque()

    async def catch_up(self, survival_tags: frozenset[str] | None = None) -> None:
        """Fold what was appended since the last call (`survival_tags`: the survival layer's
        effect and mark types, when known)."""
        if survival_tags:
            self.survival_tags = survival_tags
        await super().catch_up()

    def fold(self, event: Event) -> None:
        if event.kind != MARK_KIND:
            self._effect(event)
        tag = _tag(event)
        if tag in self.survival_tags:
            self.survival.append({"seq": event.seq, "ts": event.ts, "kind": event.kind,
                                  "type": tag, "key": event.key, "body": _body(event)})

    def _effect(self, event: Event) -> None:
        before = self.effects.get(event.key)
        if before is not None:
            self.counts[str(before.status)] -= 1
        elif event.kind != "effect":
            return  # an effect older than what is kept: only `effect` starts one anew
        entry = fold_effect(before, event)
        if entry is None:
            return
        self.effects[event.key] = entry
        self.last_seq[event.key] = event.seq
        if event.kind == "effect-executing":
            self.attempt_started[event.key] = event.ts
        elif event.kind == "effect-retried":
            self.attempt_started.pop(event.key, None)
        self.counts[str(entry.status)] += 1
        if entry.status is EffectStatus.ACKED:
            self._acked.append(entry.id)
            while len(self._acked) > ACKED_KEPT:
                gone = self._acked.popleft()
                kept = self.effects.get(gone)
                if kept is not None and kept.status is EffectStatus.ACKED:
                    del self.effects[gone]  # still counted, no longer listed
                    self.attempt_started.pop(gone, None)
                    self.last_seq.pop(gone, None)


def _body(event: Event) -> Any:
    data = event.data if isinstance(event.data, dict) else {}
    return data.get("effect") if event.kind == "effect" else data.get("mark")


def _tag(event: Event) -> str | None:
    if event.kind not in ("effect", MARK_KIND):
        return None
    body = _body(event)
    tag = body.get("type") if isinstance(body, dict) else None
    return tag if isinstance(tag, str) else None


class FleetBook(LogFold):
    """The engines sharing the log (pulse_core.FleetFold), kept current by `catch_up`."""

    kinds = FleetFold.kinds

    def __init__(self, events: EventStore) -> None:
        super().__init__(events)
        self._fleet = FleetFold()

    def fold(self, event: Event) -> None:
        self._fleet.fold(event)

    def instances(self, now: int) -> list[EngineInstance]:
        """How each engine is at `now` (ms)."""
        return self._fleet.instances(now)
