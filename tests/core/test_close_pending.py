"""close() commits the appends handed in before it, on SQLite and PostgreSQL alike: none is
dropped, each caller gets its stored events, and the log holds them all."""

from __future__ import annotations

import asyncio

from pulse_core import EventDraft
from pulse_core.store import open_event_store

APPENDS = 40



async def test_close_commits_the_appends_handed_in_before_it(store_url: str) -> None:
    store = await open_event_store(store_url)
    appends = [asyncio.ensure_future(store.append([EventDraft("tick", f"k{n}", {"n": n})]))
               for n in range(APPENDS)]
    await asyncio.sleep(0)  # each one handed in: waiting for its commit
    assert not all(a.done() for a in appends)
    await asyncio.wait_for(store.close(), 60)
    # Every append has its outcome once close() returned: the wait only bounds a hang.
    results = await asyncio.wait_for(asyncio.gather(*appends, return_exceptions=True), 30)
    assert not [r for r in results if isinstance(r, BaseException)], results
    again = await open_event_store(store_url, read_only=True)
    try:
        stored = sorted(e.data["n"] for e in await again.read(kinds=["tick"]))
    finally:
        await again.close()
    assert stored == list(range(APPENDS))
