"""Watchers: sample something on an interval, write vitals, and wake the tick when it matters."""

from __future__ import annotations

import abc
import asyncio
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from pulse_core._supervisor import wait_signal
from pulse_core.store._vitals import Sample, VitalsStore


class Watcher(abc.ABC):
    """Senses one thing. Each collect becomes a vitals sample under `key`.

    `interval` and `timeout` are seconds; `window` is how many seconds of recent samples
    `should_wake` sees. A collect that raises or outlives `timeout` is stored as a sample with
    an error; the watcher keeps running either way.
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

    async def aclose(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release what the watcher holds (files, tasks); called when its engine closes."""


async def sample_once(watcher: Watcher, vitals: VitalsStore) -> Sample:
    """Run one collect under its timeout and store the sample (data or error)."""
    try:
        async with asyncio.timeout(watcher.timeout):
            data = await watcher.collect()
    except TimeoutError:
        return await vitals.record(
            watcher.key, error=f"{watcher.name}: collect timed out after {watcher.timeout:g} s"
        )
    except Exception as exc:
        text = "".join(traceback.format_exception_only(exc)).strip()
        return await vitals.record(watcher.key, error=f"{watcher.name}: {text}")
    try:
        return await vitals.record(watcher.key, data)
    except Exception as exc:
        return await vitals.record(watcher.key, error=f"{watcher.name}: {exc}")


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
