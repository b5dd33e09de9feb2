"""Watchers: sample something on an interval, write vitals, and wake the tick when it matters."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import contextvars
import functools
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pulse_core._redact import redact_urls
from pulse_core._supervisor import wait_signal
from pulse_core._waits import reject, resolve
from pulse_core.store import Sample, VitalsStore

T = TypeVar("T")


LLM_ROUTE_KEY = "llm-route"
"""The vitals key a model route's health is sampled under: the route probes of the layers
that call a model write it (`pulse_adapters.llm.ROUTE_KEY`), the survival layer's
llm_watchdog reads it (`survival.llm.route_key`)."""

class Watcher(abc.ABC):
    """Senses one thing. Each collect becomes a vitals sample under `key`.

    `interval` and `timeout` are seconds; `window` is how many seconds of recent samples
    `should_wake` sees. A collect that raises or outlives `timeout` is stored as a sample with
    an error; the watcher keeps running either way.

    Blocking work (files, psutil, sockets without asyncio) goes through `in_thread`, never the
    event loop's shared thread pool: a collect that times out while its thread is still
    blocked leaves that one thread behind, and the watcher is skipped (a sample saying so)
    until it ends, so a stuck read costs one thread, never every tick.
    """

    name: str = ""
    key: str = ""
    interval: float = 5.0
    timeout: float = 10.0
    window: float = 60.0

    def __init__(self) -> None:
        if not self.name:
            self.name = type(self).__name__
        if not self.key:
            self.key = self.name

    @abc.abstractmethod
    async def collect(self) -> Any:
        """Take one reading; return JSON-encodable data."""

    def should_wake(self, window: Sequence[Sample]) -> bool:
        """Whether these recent samples (oldest first) call for a tick now. Default: never."""
        return False

    def nudge(self) -> None:
        """Ask for the next collect now rather than at the end of the interval."""
        self._nudged().set()

    def _nudged(self) -> asyncio.Event:
        event: asyncio.Event | None = self.__dict__.get("_nudge_event")
        if event is None:
            event = self.__dict__["_nudge_event"] = asyncio.Event()
        return event

    async def in_thread(self, fn: Callable[..., T], /, *args: Any) -> T:
        """`fn(*args)` run in a daemon thread of this watcher's own, awaited.

        Cancelling the wait (a timed-out collect) does not stop the thread: until it ends,
        `busy_for` says how long it has been running and the watcher is not sampled again.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        context = contextvars.copy_context()
        threads = self._threads()

        def run() -> None:
            try:
                result = context.run(fn, *args)
            except Exception as exc:
                settle: Callable[[], None] = functools.partial(reject, done, exc)
            else:
                settle = functools.partial(resolve, done, result)
            finally:
                threads.pop(thread, None)
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle)

        thread = threading.Thread(target=run, name=f"pulse-watcher-{self.name}", daemon=True)
        threads[thread] = loop.time()
        thread.start()
        return await done

    def busy_for(self) -> float | None:
        """Seconds the oldest thread started by `in_thread` has been running; None if none is."""
        starts = self._threads().copy().values()  # copied at once: threads remove themselves
        if not starts:
            return None
        return asyncio.get_running_loop().time() - min(starts)

    def _threads(self) -> dict[threading.Thread, float]:
        threads: dict[threading.Thread, float] | None = self.__dict__.get("_thread_starts")
        if threads is None:
            threads = self.__dict__["_thread_starts"] = {}
        return threads

    async def aclose(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release what the watcher holds (files, tasks); called when its engine closes."""


async def sample_once(watcher: Watcher, vitals: VitalsStore) -> Sample:
    """Run one collect under its timeout and store the sample (data or error).

    While a thread of the previous collect is still running, no collect starts: the sample
    says the watcher was skipped and for how long that thread has been blocked.
    """
    busy = watcher.busy_for()
    if busy is not None:
        return await vitals.record(
            watcher.key, error=f"{watcher.name}: skipped — a thread of an earlier collect has "
                               f"been blocked for {busy:.1f} s; sampling resumes once it ends")
    try:
        async with asyncio.timeout(watcher.timeout):
            data = await watcher.collect()
    except TimeoutError:
        stuck = "; its thread is still blocked, and the watcher is skipped until it ends" \
            if watcher.busy_for() is not None else ""
        return await vitals.record(
            watcher.key,
            error=f"{watcher.name}: collect timed out after {watcher.timeout:g} s{stuck}")
    except Exception as exc:
        text = "".join(traceback.format_exception_only(exc)).strip()
        return await vitals.record(watcher.key, error=f"{watcher.name}: {redact_urls(text)}")
    try:
        return await vitals.record(watcher.key, data)
    except Exception as exc:
        return await vitals.record(watcher.key, error=f"{watcher.name}: {redact_urls(str(exc))}")


async def wants_wake(watcher: Watcher, vitals: VitalsStore) -> bool:
    """`should_wake` over the watcher's recent window."""
    since = vitals.clock.now_ms() - int(watcher.window * 1000)
    return bool(watcher.should_wake(await vitals.window(watcher.key, since)))


async def watch_forever(
    watcher: Watcher,
    vitals: VitalsStore,
    wake: Callable[[], None],
) -> None:
    """Sample every `interval` seconds and wake the tick when asked, until cancelled.

    A collect that fails is a sample with an error; anything else that fails (should_wake,
    the vitals store) raises, for the supervisor to record and restart after its backoff.
    """
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await sample_once(watcher, vitals)
        if await wants_wake(watcher, vitals):
            wake()
        nudged = watcher._nudged()
        await wait_signal(nudged, watcher.interval - (loop.time() - started))
        nudged.clear()
