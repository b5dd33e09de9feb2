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
from pulse_core import Event, EventStore, VitalsStore

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


class Feed:
    """One follower of the log for every live stream of the UI's process: each new event is
    read once and handed to every subscriber. Commits by the engine's process are seen within
    `poll_s` on SQLite (PostgreSQL wakes it at once). A subscriber that falls QUEUE_MAX
    events behind is dropped (its browser reconnects and resumes from its last id)."""

    QUEUE_MAX = 10_000

    def __init__(self, store: EventStore, poll_s: float = 0.25) -> None:
        self.store = store
        self.poll_s = poll_s
        self._queues: set[asyncio.Queue[Event | None]] = set()
        self._task: asyncio.Task[None] | None = None

    def subscribe(self) -> asyncio.Queue[Event | None]:
        """A queue of every event committed from now on (None: you fell behind; stop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._follow(), name="pulse-web-feed")
        queue: asyncio.Queue[Event | None] = asyncio.Queue(self.QUEUE_MAX)
        self._queues.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Event | None]) -> None:
        self._queues.discard(queue)

    def subscribed(self, queue: asyncio.Queue[Event | None]) -> bool:
        """Whether `queue` still gets events (it is dropped when it falls behind)."""
        return queue in self._queues

    async def _follow(self) -> None:
        async for event in self.store.changes(await self.store.last_seq(),
                                              poll_interval=self.poll_s):
            for queue in list(self._queues):
                try:
                    queue.put_nowait(event)
                except asyncio.QueueFull:
                    self._queues.discard(queue)
                    with contextlib.suppress(asyncio.QueueEmpty):
                        queue.get_nowait()
                    queue.put_nowait(None)


def event_stream(feed: Feed, f: EventFilter, after: int,
                 to_json: Callable[[Any], dict[str, Any]]) -> AsyncIterator[str]:
    """Every event after seq `after` that matches `f`, as it commits (`event` messages whose
    id is the seq, so a reconnecting browser resumes where it was)."""
    kinds = set(f.kinds)

    def wanted(event: Event) -> bool:
        return (not kinds or event.kind in kinds) and (
            f.key is None or event.key == f.key) and matches(event, f)

    async def events() -> AsyncIterator[str]:
        queue = feed.subscribe()
        try:
            last = after
            while True:  # what committed before the feed took over
                backlog = await feed.store.read(last, kinds=list(kinds) or None, key=f.key,
                                                limit=500)
                for old in backlog:
                    last = old.seq
                    if matches(old, f):
                        yield message("event", to_json(old), id=old.seq)
                if len(backlog) < 500:
                    break
            while (event := await queue.get()) is not None:
                chunk: list[str] = []  # what arrived together goes out in one write
                while event is not None:
                    if event.seq > last and wanted(event):
                        last = event.seq
                        chunk.append(message("event", to_json(event), id=event.seq))
                    event = queue.get_nowait() if not queue.empty() else None
                if chunk:
                    yield "".join(chunk)
                if queue.empty() and not feed.subscribed(queue):
                    return  # fell behind and was dropped: the browser resumes from its id
        finally:
            feed.unsubscribe(queue)
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
