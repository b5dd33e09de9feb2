"""Server-sent event streams of the live pages: new events as they commit, the overview at a
steady beat, new vitals samples. Each stream is an async generator of SSE messages that
Starlette sends until the browser goes away; a comment line every KEEPALIVE_S keeps proxies
from closing an idle stream.

Every event stream of the UI's process is fed by one Feed: it reads each new event once,
encodes it once (however many streams send it), and hands the same bytes to every stream
that wants it. A stream whose browser reads too slowly holds at most PENDING_BYTES of them;
beyond that it is dropped, and its browser reconnects and resumes after the last event it
got (its `id`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, NamedTuple

import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pulse_adapters.web._query import EventFilter, matches
from pulse_core import Event, EventStore, StoreClosed, VitalsStore, wait_ended

KEEPALIVE_S = 15.0
RETRY_MS = 2_000
"""How soon a browser reconnects a dropped stream (it resumes after the last event id)."""
CHUNK_BYTES = 256 * 1024
"""The most a stream writes at once when several events wait (one larger event is one write)."""
PAGE = 100
"""Events read from the log at a time, by the feed and by a stream catching up."""

_encoder = msgspec.json.Encoder(enc_hook=str)


def message(event: str, data: Any, id: int | None = None) -> bytes:
    """One SSE message."""
    head = f"event: {event}\nid: {id}\ndata: " if id is not None else \
        f"event: {event}\ndata: "
    return b"".join((head.encode(), _encoder.encode(data), b"\n\n"))


async def _with_keepalive(source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`source`'s messages, and a comment whenever it is silent for KEEPALIVE_S."""
    yield f"retry: {RETRY_MS}\n\n".encode()
    pending: asyncio.Task[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(source))
            done, _ = await asyncio.wait({pending}, timeout=KEEPALIVE_S)
            if not done:
                yield b": keepalive\n\n"
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
            await wait_ended(pending)  # not awaited: a cancel of the stream itself propagates
        with contextlib.suppress(RuntimeError):
            await source.aclose()  # type: ignore[attr-defined]


class Published(NamedTuple):
    """A new event and its message, encoded once for every stream."""

    event: Event
    text: bytes


class Subscription:
    """What the Feed holds for one stream: the published events it wants and has not taken
    yet, within the Feed's bounds; once `dropped`, nothing more."""

    def __init__(self, wants: Callable[[Event], bool]) -> None:
        self.wants = wants
        self.dropped = False
        self._pending: collections.deque[Published] = collections.deque()
        self._size = 0
        self._ready = asyncio.Event()

    def offer(self, item: Published, max_bytes: int, max_events: int) -> bool:
        """Hold `item` for the stream; False when that would pass a bound (one event alone
        always fits)."""
        if self._pending and (self._size + len(item.text) > max_bytes
                              or len(self._pending) >= max_events):
            return False
        self._pending.append(item)
        self._size += len(item.text)
        self._ready.set()
        return True

    def drop(self) -> None:
        self.dropped = True
        self._pending.clear()
        self._size = 0
        self._ready.set()

    async def take(self) -> list[Published]:
        """Every event held (at least one, waiting for it), or [] once dropped."""
        while not self._pending and not self.dropped:
            self._ready.clear()
            await self._ready.wait()
        taken = list(self._pending)
        self._pending.clear()
        self._size = 0
        return [] if self.dropped else taken


class Feed:
    """One follower of the log for every live event stream of the UI's process. Commits by
    the engine's process are seen within `poll_s` on SQLite (PostgreSQL wakes it at once).

    `encoded` counts the event messages it encoded, `dropped` the streams it let go of for
    falling behind (both shown in /metrics)."""

    PENDING_BYTES = 8 * 1024 * 1024
    PENDING_EVENTS = 10_000
    CACHE_BYTES = 8 * 1024 * 1024
    """The newest messages kept for streams that catch up from the log (a page reconnecting
    after the UI restarted, say), so those too are encoded once."""

    def __init__(self, store: EventStore, to_json: Callable[[Event], dict[str, Any]],
                 poll_s: float = 0.25) -> None:
        self.store = store
        self.to_json = to_json
        self.poll_s = poll_s
        self.encoded = 0
        self.dropped = 0
        self._subscriptions: set[Subscription] = set()
        self._task: asyncio.Task[None] | None = None
        self._head: asyncio.Future[int] | None = None
        self._cache: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._cached = 0

    @property
    def streams(self) -> int:
        """Event streams open now."""
        return len(self._subscriptions)

    async def subscribe(self, wants: Callable[[Event], bool]) -> Subscription:
        """The events `wants` accepts, committed after the feed started: read what came
        before from the store once this returns."""
        if self._task is None or self._task.done():
            self._head = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._follow(self._head), name="pulse-web-feed")
        assert self._head is not None
        await asyncio.shield(self._head)
        subscription = Subscription(wants)
        self._subscriptions.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self._subscriptions.discard(subscription)

    def encode(self, event: Event) -> bytes:
        """`event`'s message, encoded at most once while it is among the newest."""
        text = self._cache.get(event.seq)
        if text is not None:
            self._cache.move_to_end(event.seq)
            return text
        text = message("event", self.to_json(event), id=event.seq)
        self.encoded += 1
        if len(text) <= self.CACHE_BYTES:
            self._cache[event.seq] = text
            self._cached += len(text)
            while self._cached > self.CACHE_BYTES:
                _, old = self._cache.popitem(last=False)
                self._cached -= len(old)
        return text

    async def _follow(self, head: asyncio.Future[int]) -> None:
        try:
            start = await self.store.last_seq()
            head.set_result(start)
            async for event in self.store.changes(start, poll_interval=self.poll_s,
                                                  batch=PAGE):
                wanting = [s for s in self._subscriptions if s.wants(event)]
                if wanting:
                    item = Published(event, self.encode(event))
                    for subscription in wanting:
                        if not subscription.offer(item, self.PENDING_BYTES,
                                                  self.PENDING_EVENTS):
                            self._drop(subscription)
                await asyncio.sleep(0)  # a burst of large events leaves room for requests
        except StoreClosed:
            return  # the UI's process is stopping
        except Exception as exc:
            if not head.done():
                head.set_exception(exc)
            raise
        finally:
            head.cancel()  # if it is still unknown
            for subscription in list(self._subscriptions):
                subscription.drop()  # their browsers reconnect, and start a new feed
            self._subscriptions.clear()

    def _drop(self, subscription: Subscription) -> None:
        self._subscriptions.discard(subscription)
        subscription.drop()
        self.dropped += 1


def stream_families(feed: Feed) -> Iterator[Metric]:
    """The UI's own stream figures, for /metrics."""
    yield GaugeMetricFamily("pulse_web_event_streams", "Live event streams the web UI holds "
                            "open", value=feed.streams)
    yield CounterMetricFamily("pulse_web_event_messages_encoded", "Event messages the web "
                              "UI encoded for its live streams (once per event, however many "
                              "streams send it)", value=feed.encoded)
    yield CounterMetricFamily("pulse_web_event_streams_dropped", "Live event streams the web "
                              "UI ended because their client fell behind (it reconnects and "
                              "resumes)", value=feed.dropped)


def _chunks(texts: Iterable[bytes]) -> Iterator[bytes]:
    """`texts` joined into writes of about CHUNK_BYTES."""
    joined: list[bytes] = []
    size = 0
    for text in texts:
        if joined and size + len(text) > CHUNK_BYTES:
            yield joined[0] if len(joined) == 1 else b"".join(joined)
            joined, size = [], 0
        joined.append(text)
        size += len(text)
    if joined:
        yield joined[0] if len(joined) == 1 else b"".join(joined)


def event_stream(feed: Feed, f: EventFilter, after: int) -> AsyncIterator[bytes]:
    """Every event after seq `after` that matches `f`, as it commits (`event` messages whose
    id is the seq, so a reconnecting browser resumes where it was)."""
    kinds = set(f.kinds)

    def wanted(event: Event) -> bool:
        return (not kinds or event.kind in kinds) and (
            f.key is None or event.key == f.key) and matches(event, f)

    async def events() -> AsyncIterator[bytes]:
        subscription = await feed.subscribe(wanted)
        try:
            last = after
            while True:  # what committed before the feed took over
                backlog = await feed.store.read(last, kinds=list(kinds) or None, key=f.key,
                                                limit=PAGE)
                if backlog:
                    last = backlog[-1].seq
                for text in _chunks(feed.encode(e) for e in backlog if matches(e, f)):
                    yield text
                if len(backlog) < PAGE:
                    break
            while published := await subscription.take():
                fresh = [p for p in published if p.event.seq > last]
                if fresh:
                    last = fresh[-1].event.seq
                for text in _chunks(p.text for p in fresh):
                    yield text
        finally:
            feed.unsubscribe(subscription)
    return _with_keepalive(events())


class Beat:
    """A message rebuilt every `every_s` for every stream that shows it: however many pages
    are open, `build` runs about once a beat."""

    def __init__(self, name: str, every_s: float, build: Callable[[], Awaitable[Any]]) -> None:
        self.name = name
        self.every_s = every_s
        self.build = build
        self.built = 0
        self._latest: tuple[float, bytes] | None = None
        self._building = asyncio.Lock()

    async def latest(self) -> bytes:
        """The message, built anew when the last one is half a beat old."""
        async with self._building:
            now = asyncio.get_running_loop().time()
            if self._latest is None or now - self._latest[0] >= self.every_s / 2:
                self._latest = (now, message(self.name, await self.build()))
                self.built += 1
            return self._latest[1]

    def stream(self) -> AsyncIterator[bytes]:
        """The message now and every `every_s` seconds."""
        async def beats() -> AsyncIterator[bytes]:
            while True:
                yield await self.latest()
                await asyncio.sleep(self.every_s)
        return _with_keepalive(beats())


def vitals_stream(vitals: VitalsStore, every_s: float) -> AsyncIterator[bytes]:
    """Each new vitals sample (a `sample` message: key, ts, ok, data) as it is recorded."""
    async def samples() -> AsyncIterator[bytes]:
        cursor = await vitals.cursor()
        while True:
            cursor, found = await vitals.since(cursor)
            for key, recorded in found.items():
                for sample in recorded:
                    yield message("sample", {"key": key, "ts": sample.ts, "ok": sample.ok,
                                             "data": sample.data, "error": sample.error})
            await asyncio.sleep(every_s)
    return _with_keepalive(samples())
