"""The recall tool's one lookup, over today's memory fold (kept alone so a richer recall
can take its place)."""

from __future__ import annotations

from pulse_core import EventStore, read_identity


async def lookup(store: EventStore, identity: str, query: str, limit: int) -> list[str]:
    """The texts of `identity`'s facts and exchanges that contain every word of `query`
    (case-insensitive), newest first, at most `limit`."""
    records = await read_identity(store, identity)
    if records is None:
        return []
    words = query.casefold().split()
    texts = [f.text for f in records.facts] + [x.text for x in records.exchanges]
    return [t for t in texts if all(w in t.casefold() for w in words)][:limit]
