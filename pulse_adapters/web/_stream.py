"""Server-sent event streams of the live pages: new events as they commit, the overview at a
steady beat, new vitals samples. Each stream is an async generator of SSE messages that
Starlette sends until the browser goes away; a comment line every KEEPALIVE_S keeps proxies
from closing an idle stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pulse_adapters.web._query import EventFilter, matches
from pulse_core import EventStore, VitalsStore

KEEPALIVE_S = 15.0
RETRY_MS = 2_000
"""How soon a browser reconnects a dropped stream (it resumes after the last event id)."""


def message(event: str, data: Any, id: int | None = None) -> str:
    """One SSE message."""
    lines = [f"event: {event}"]
    if id is not None:
        lines.append(f"id: {id}")
    lines.append(f"data: {json.dumps(data, separators=(',', ':'), default=str)}")
    return "\n".join(lines) + "\n\n"


async def _with_keepalive(source: AsyncIterator[str]) -> AsyncIterator[str]:
    """`source`'s messages, and a comment whenever it is silent for KEEPALIVE_S."""
    yield f"retry: {RETRY_MS}\n\n"
    pending: asyncio.Task[str] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(source))
            done, _ = await asyncio.wait({pending}, timeout=KEEPALIVE_S)
            if not done:
                yield ": keepalive\n\n"
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        with contextlib.suppress(RuntimeError):
            await source.aclose()  # type: ignore[attr-defined]


def event_stream(store: EventStore, f: EventFilter, after: int,
                 to_json: Callable[[Any], dict[str, Any]]) -> AsyncIterator[str]:
    """Every event after seq `after` that matches `f`, as it commits (`event` messages whose
    id is the seq, so a reconnecting browser resumes where it was)."""
    async def events() -> AsyncIterator[str]:
        async for event in store.changes(after, kinds=list(f.kinds) or None,
                                         poll_interval=1.0):
            if (f.key is None or event.key == f.key) and matches(event, f):
                yield message("event", to_json(event), id=event.seq)
    return _with_keepalive(events())


def beat_stream(name: str, every_s: float, build: Callable[[], Awaitable[Any]]
                ) -> AsyncIterator[str]:
    """`build()`'s result as a `name` message now and every `every_s` seconds."""
    async def beats() -> AsyncIterator[str]:
        while True:
            yield message(name, await build())
            await asyncio.sleep(every_s)
    return _with_keepalive(beats())


def vitals_stream(vitals: VitalsStore, every_s: float) -> AsyncIterator[str]:
    """Each new vitals sample (a `sample` message: key, ts, ok, data) as it is recorded."""
    async def samples() -> AsyncIterator[str]:
        cursor = await vitals.cursor()
        while True:
            cursor, found = await vitals.since(cursor)
            for key, recorded in found.items():
                for sample in recorded:
                    yield message("sample", {"key": key, "ts": sample.ts, "ok": sample.ok,
                                             "data": sample.data, "error": sample.error})
            await asyncio.sleep(every_s)
    return _with_keepalive(samples())
