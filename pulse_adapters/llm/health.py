"""Route health: is the model route answering? Probed, cached for a TTL, written to vitals.

The survival layer's llm_watchdog reads `data["ok"]` of the "llm-route" vitals key; a probe
writes `{"ok": bool, "latency_ms": float, "error": str | None, "via": "models" | "completion"}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from pulse_adapters.llm.client import ChatClient
from pulse_adapters.llm.errors import EmptyOutput, HttpStatusError, LlmError, excerpt
from pulse_core import LLM_ROUTE_KEY, Clock, Sample, SystemClock, VitalsStore, Watcher

PROBE_MESSAGES = ({"role": "user", "content": "ping"},)


ROUTE_KEY = LLM_ROUTE_KEY
"""The vitals key a model route's probes are written under by default (pulse_core's
LLM_ROUTE_KEY); the survival layer's llm_watchdog reads it (its `llm.route_key`)."""

class RouteHealth:
    """The cached health contract of one ChatClient's route.

    `check()` answers from the last verdict while it is younger than `ttl_s`, and otherwise
    probes: GET {base_url}/models, or, where that is 404, a one-token completion (an empty
    answer still proves the route). Each probe `check()` makes is written to `vitals` under
    `key`. `poison(reason)` records a failure seen elsewhere (a stream that broke mid-way),
    so the route reads unhealthy at once and is probed again only after `ttl_s`.
    """

    def __init__(
        self,
        client: ChatClient,
        vitals: VitalsStore | None = None,
        *,
        key: str = ROUTE_KEY,
        ttl_s: float = 30.0,
        clock: Clock | None = None,
        probe_timeout_s: float = 5.0,
    ) -> None:
        if ttl_s < 0 or probe_timeout_s <= 0:
            raise ValueError(f"ttl_s ({ttl_s}) must be >= 0 and probe_timeout_s "
                             f"({probe_timeout_s}) > 0 seconds")
        self.client = client
        self.vitals = vitals
        self.key = key
        self.ttl_s = ttl_s
        self.probe_timeout_s = probe_timeout_s
        self.clock: Clock = clock or (vitals.clock if vitals is not None else SystemClock())
        self._reading: dict[str, Any] | None = None
        self._verdict_at_ms: int | None = None
        self._poisonings = 0
        self.on_poison: list[Callable[[], None]] = []
        self._lock = asyncio.Lock()

    @property
    def reading(self) -> dict[str, Any] | None:
        """The last verdict: a probe's reading, or the poisoning; None before either."""
        return self._reading

    async def check(self) -> bool:
        """Whether the route answers: the cached verdict within `ttl_s`, else a new probe."""
        if self._fresh():
            return self._ok()
        async with self._lock:
            if self._fresh():
                return self._ok()
            reading = await self.probe()
            if self.vitals is not None:
                await self.vitals.record(self.key, reading)
            return self._ok()

    async def probe(self) -> dict[str, Any]:
        """Probe the route now and cache the verdict; returns the reading, writes nothing.

        A poisoning that lands while the probe runs wins over the probe's verdict.
        """
        poisonings = self._poisonings
        started = time.perf_counter()
        via = "models"
        error: str | None = None
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                try:
                    await self.client.models()
                except HttpStatusError as exc:
                    if exc.status != 404:
                        raise
                    via = "completion"
                    with contextlib.suppress(EmptyOutput):
                        await self.client.complete(PROBE_MESSAGES, max_tokens=1, temperature=0)
        except TimeoutError:
            error = (f"{self.client.base_url} gave no {via} answer within probe_timeout_s "
                     f"({self.probe_timeout_s:g} s)")
        except LlmError as exc:
            error = excerpt(str(exc))
        reading = {"ok": error is None, "latency_ms": round((time.perf_counter() - started)
                                                             * 1000, 2),
                   "error": error, "via": via}
        if poisonings == self._poisonings:
            self._reading, self._verdict_at_ms = reading, self.clock.now_ms()
        return reading

    def poison(self, reason: str) -> None:
        """Mark the route unhealthy now; the next probe comes after `ttl_s`.

        A RouteProbeWatcher on this health is nudged, so the poisoned verdict reaches vitals
        at once and the awareness rule falls back to its slower cadence.
        """
        self._poisonings += 1
        self._reading = {"ok": False, "latency_ms": None, "error": f"poisoned: {reason}",
                         "via": "poison"}
        self._verdict_at_ms = self.clock.now_ms()
        for listener in self.on_poison:
            listener()

    def cached(self) -> dict[str, Any] | None:
        """The last verdict while it is within `ttl_s`, else None."""
        return dict(self._reading) if self._reading is not None and self._fresh() else None

    def _fresh(self) -> bool:
        return (self._verdict_at_ms is not None
                and self.clock.now_ms() - self._verdict_at_ms < self.ttl_s * 1000)

    def _ok(self) -> bool:
        return self._reading is not None and bool(self._reading["ok"])


class RouteProbeWatcher(Watcher):
    """Runs RouteHealth's probe as an engine watcher, every `ttl_s` by default.

    The engine writes each reading as the watcher's sample, so the probe itself writes
    nothing, and `check()` calls in between answer from the watcher's last verdict. Wakes
    the tick when the route fails or recovers, so llm_watchdog counts every failed probe.
    """

    name = ROUTE_KEY

    def __init__(self, health: RouteHealth, *, interval_s: float | None = None) -> None:
        super().__init__()
        self.health = health
        self.key = health.key
        self.interval = health.ttl_s if interval_s is None else interval_s
        self.timeout = health.probe_timeout_s + 1.0
        health.on_poison.append(self.nudge)

    async def collect(self) -> dict[str, Any]:
        verdict = self.health.cached()
        if verdict is not None and not verdict["ok"]:
            return verdict  # poisoned or failed within the TTL: do not probe yet
        return await self.health.probe()

    def should_wake(self, window: Sequence[Sample]) -> bool:
        states = [_sample_ok(s) for s in window[-2:]]
        return bool(states) and (not states[-1] or len(set(states)) > 1)


def _sample_ok(sample: Sample) -> bool:
    return sample.ok and isinstance(sample.data, dict) and bool(sample.data.get("ok"))
