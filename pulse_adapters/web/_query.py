"""The Events page's query: the newest events that match a filter, a page at a time, newest
first. Without a time bound or an older page it is one read of the store (kinds through their
index, the origin prefix as the store filters it); otherwise it walks back through the log
in bounded windows and says where to go on."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from pulse_core import EffectStatus, Event, EventStore

WINDOW = 1_000
MAX_WINDOWS = 200
_NUMBER = re.compile(r"[0-9]{1,18}")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
EFFECT_STATES = tuple(str(s) for s in EffectStatus if s is not EffectStatus.ACKED)
"""The states `effects=` selects by (an acked effect is its one `effect-acked` event)."""


class BadQuery(ValueError):
    """A query parameter the Events page cannot use; the message names it."""


@dataclass(frozen=True)
class EventFilter:
    """Which events: kinds (any of), key, origin (prefix), since (a seq, or ms epoch for a
    duration), before (a seq: older than it), at most `limit`. `effects` (states) selects
    instead, for each effect in one of them, the event that put it there."""

    kinds: tuple[str, ...] = ()
    key: str | None = None
    origin: str | None = None
    after_seq: int = 0
    since_ms: int | None = None
    before: int | None = None
    limit: int = 100
    effects: tuple[str, ...] = ()


def number(text: str | None) -> int | None:
    """`text` as a seq or a count (ASCII digits, below 10**18), else None."""
    return int(text) if text is not None and _NUMBER.fullmatch(text) else None


def parse_filter(params: dict[str, list[str]], max_limit: int) -> EventFilter:
    """An EventFilter from query parameters (`kind` may repeat); BadQuery names the bad one."""
    def one(name: str) -> str | None:
        values = params.get(name) or []
        return values[-1] if values and values[-1] != "" else None

    since, after_seq, since_ms = one("since"), 0, None
    if since is not None:
        if (seq := number(since)) is not None:
            after_seq = seq
        elif (match := _DURATION.match(since)) is not None:
            since_ms = int((time.time() - float(match[1]) * _UNIT_S[match[2]]) * 1000)
        else:
            raise BadQuery(f"since={since!r}: give a seq (120) or a duration (90s, 10m, 2h, 1d)")
    before = one("before")
    if before is not None and number(before) is None:
        raise BadQuery(f"before={before!r}: give a seq")
    limit = one("limit") or "100"
    count = number(limit)
    if count is None or not 1 <= count <= max_limit:
        raise BadQuery(f"limit={limit!r}: give 1..{max_limit}")
    found = EventFilter(tuple(k for k in params.get("kind", []) if k), one("key"),
                        one("origin"), after_seq, since_ms, int(before) if before else None,
                        int(limit), _effect_states(params.get("effects", [])))
    if found.effects and (found.kinds or found.key or found.origin or since is not None):
        raise BadQuery("effects= selects effects by state and takes no other filter but "
                       "before and limit: drop kind, key, origin and since")
    return found


def _effect_states(given: list[str]) -> tuple[str, ...]:
    """The states `effects=` names; BadQuery for one it cannot select by."""
    for state in given:
        if state == str(EffectStatus.ACKED):
            raise BadQuery("effects=acked: each acked effect is its one effect-acked event — "
                           "give kind=effect-acked")
        if state not in EFFECT_STATES:
            raise BadQuery(f"effects={state!r}: give one of {', '.join(EFFECT_STATES)}")
    return tuple(dict.fromkeys(given))


def matches(event: Event, f: EventFilter) -> bool:
    return (f.origin is None or event.origin.startswith(f.origin)) and (
        f.since_ms is None or event.ts >= f.since_ms)


async def newest(store: EventStore, f: EventFilter) -> tuple[list[Event], int | None]:
    """The newest events matching `f`, newest first, and the seq to pass as `before` for the
    next older page (None when there is none)."""
    kinds = list(f.kinds) or None
    if f.since_ms is None and f.before is None:
        low = f.after_seq
        if f.origin is not None:  # no index: one read looks at most as far back as windows do
            low = max(low, await store.last_seq() - MAX_WINDOWS * WINDOW)
        found = await store.read(low, kinds=kinds, key=f.key, limit=f.limit,
                                 newest_first=True, origin_prefix=f.origin)
        if len(found) == f.limit:
            older = found[-1].seq if found[-1].seq > f.after_seq + 1 else None
        else:
            older = low + 1 if low > f.after_seq else None
        return found, older
    head = await store.last_seq()
    high = head + 1 if f.before is None else min(f.before, head + 1)
    found = []
    for _ in range(MAX_WINDOWS):
        if high <= f.after_seq + 1 or len(found) >= f.limit:
            break
        low = max(f.after_seq, high - 1 - WINDOW)
        window = [e for e in await store.read(low, kinds=kinds, key=f.key, limit=WINDOW)
                  if e.seq < high]
        window.reverse()
        for event in window:
            if f.since_ms is not None and event.ts < f.since_ms:
                return found, None  # older than the time bound: nothing older can match
            if matches(event, f):
                found.append(event)
                if len(found) == f.limit:
                    return found, event.seq
        high = low + 1
    return found, (high if high > f.after_seq + 1 else None)

