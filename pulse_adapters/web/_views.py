"""The JSON the UI's pages read: each function takes the running engine (and the UI's
LogBook) and returns plain data. Nothing here writes, except the two effect controls."""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from typing import Any

import msgspec

from pulse_adapters.web._book import LogBook
from pulse_adapters.web._query import EventFilter, newest
from pulse_adapters.web._view import EngineView
from pulse_core import Causes, EffectEntry, EffectStatus, Event, Tasks, causes_of, event_at

EVENT_PAGE_MAX = 500
HISTORY_MAX = 200
ATTACHMENT_PREVIEW = 4_096


class TickRate:
    """Ticks per minute over the last few minutes, from the tick counter as sampled."""

    def __init__(self, window_s: float = 300.0) -> None:
        self.window_s = window_s
        self._seen: deque[tuple[float, int]] = deque()

    def per_minute(self, ticks: int) -> float | None:
        now = time.monotonic()
        self._seen.append((now, ticks))
        while self._seen and now - self._seen[0][0] > self.window_s:
            self._seen.popleft()
        first_at, first = self._seen[0]
        if now - first_at < 1.0:
            return None
        return round((ticks - first) * 60.0 / (now - first_at), 2)


def revision(home: Path) -> str | None:
    """The engine directory's revision the daemon reports (HOME/daemon.status.json)."""
    try:
        found = json.loads((home / "daemon.status.json").read_text())
    except (OSError, ValueError):
        return None
    value = found.get("revision") if isinstance(found, dict) else None
    return value if isinstance(value, str) else None


def effect_json(entry: EffectEntry, attempt_started: int | None = None) -> dict[str, Any]:
    """One effect as the Effects page shows it. `duration_ms`, what its last attempt took
    (from its claim at `attempt_started` to its outcome), is None while it is unfinished or
    when it never ran; an acked effect's `error` is None, and the error of an earlier attempt
    that failed is `earlier_error`."""
    ran = entry.finished and attempt_started is not None and entry.attempt > 0
    acked = entry.status is EffectStatus.ACKED
    return {"id": entry.id, "seq": entry.seq, "type": entry.tag, "status": str(entry.status),
            "attempt": entry.attempt, "owner": entry.owner, "host": entry.host,
            "lease_until": entry.lease_until or None, "retry_at": entry.retry_at or None,
            "created_at": entry.created_at, "updated_at": entry.updated_at,
            "attempt_started_at": attempt_started,
            "duration_ms": entry.updated_at - attempt_started
            if ran and attempt_started is not None else None,
            "origin": entry.origin, "error": None if acked else entry.error,
            "earlier_error": entry.error if acked else None, "result": entry.result,
            "body": entry.body}


def effect_counts(book: LogBook) -> dict[str, int]:
    """How many effects are in each state."""
    return {str(status): book.counts[str(status)] for status in EffectStatus}


def effects(book: LogBook, status: str | None, limit: int) -> list[dict[str, Any]]:
    """The newest `limit` effects the book keeps, only those in `status` when given."""
    chosen = [e for e in book.effects.values() if status in (None, str(e.status))]
    chosen.sort(key=lambda e: e.seq, reverse=True)
    return [effect_json(e, book.attempt_started.get(e.id)) for e in chosen[:limit]]


async def effects_in(engine: EngineView, book: LogBook, statuses: frozenset[str],
                     before: int | None, limit: int) -> tuple[list[Event], int | None]:
    """The events that make up the count of effects in `statuses` (not acked: the book keeps
    every other effect whole): for each such effect, its newest event (the one that put it
    there), newest first, older than `before`; a page of `limit`, and the seq to pass as
    `before` for the next (None when there is none)."""
    seqs = sorted((book.last_seq[i] for i, e in book.effects.items()
                   if str(e.status) in statuses and i in book.last_seq
                   and (before is None or book.last_seq[i] < before)), reverse=True)
    found = [e for seq in seqs[:limit] if (e := await event_at(engine.events, seq))]
    return found, (seqs[limit - 1] if len(seqs) > limit else None)


async def tasks(engine: EngineView) -> list[dict[str, Any]]:
    """Every task, newest first."""
    snapshot = await engine.snapshot()
    found = sorted(snapshot.state(Tasks).values(), key=lambda t: t.created_at, reverse=True)
    return [msgspec.to_builtins(t) for t in found]


def event_json(event: Event) -> dict[str, Any]:
    """One event as the Events page shows it."""
    return {"seq": event.seq, "id": event.id, "kind": event.kind, "key": event.key,
            "version": event.version, "ts": event.ts, "origin": event.origin,
            "cause": event.cause, "attachment": event.hash, "data": event.data}


def causes_json(causes: Causes) -> dict[str, Any]:
    """An event's Causes as the pages show them: `causes`, its chain nearest first (a cause
    that cannot be read ends it as `{"seq", "missing": true}`), and `tick`, the tick that
    decided it (None when none did)."""
    chain: list[dict[str, Any]] = [event_json(e) for e in causes.chain]
    if causes.missing is not None:
        chain.append({"seq": causes.missing, "missing": True})
    return {"causes": chain,
            "tick": None if causes.tick is None else event_json(causes.tick)}


async def event_detail(engine: EngineView, seq: int) -> dict[str, Any] | None:
    """An event with its causes (see causes_json) and its attachment."""
    event = await event_at(engine.events, seq)
    if event is None:
        return None
    detail = {**event_json(event), **causes_json(await causes_of(engine.events, event)),
              "attachment_info": None}
    if event.hash:
        detail["attachment_info"] = await _attachment(engine, event.hash)
    return detail


async def history(engine: EngineView, key: str, seq: int | None) -> dict[str, Any]:
    """The events of `key`, oldest first, each with its causes: the newest HISTORY_MAX, or,
    around event `seq`, up to HISTORY_MAX / 2 on either side of it (`earlier`, `later`: whether
    the key has events beyond those listed)."""
    store, half = engine.events, HISTORY_MAX // 2
    if seq is None:
        found, older = await newest(store, EventFilter(key=key, limit=HISTORY_MAX))
        after: list[Event] = []
    else:
        found, older = await newest(store, EventFilter(key=key, before=seq + 1, limit=half))
        after = await store.read(seq, key=key, limit=half + 1)
    listed = [*reversed(found), *after[:half]]
    return {"key": key, "earlier": older is not None, "later": len(after) > half,
            "events": [{**event_json(e), **causes_json(await causes_of(store, e))}
                       for e in listed]}


async def _attachment(engine: EngineView, digest: str) -> dict[str, Any]:
    try:
        payload = await engine.objects.get(digest)
    except (OSError, KeyError, ValueError) as exc:
        return {"digest": digest, "stored": False, "reason": str(exc)}
    text = payload[:ATTACHMENT_PREVIEW].decode("utf-8", errors="replace")
    return {"digest": digest, "stored": True, "size": len(payload), "preview": text,
            "truncated": len(payload) > ATTACHMENT_PREVIEW}


class NotFound(LookupError):
    """The UI was asked about something that does not exist (an action, an effect)."""


async def control_effect(engine: EngineView, action: str, effect_id: str, reason: str
                         ) -> Event:
    """Cancel or retry effect `effect_id` as the UI's operator (origin `web`)."""
    from pulse_core import cancel_effect, retry_effect

    if action not in ("cancel", "retry"):
        raise NotFound(f"no effect action {action!r}: cancel or retry")
    act = cancel_effect if action == "cancel" else retry_effect
    async with engine.writable() as store:
        return await act(store, effect_id, reason=reason, origin="web")
