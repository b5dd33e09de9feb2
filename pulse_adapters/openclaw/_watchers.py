"""What the openclaw layer senses: the gateway's HTTP probes, its model route, its store."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import httpx

from pulse_adapters.llm import ChatClient, RouteHealth, RouteProbeWatcher
from pulse_adapters.openclaw._cli import OpenClawCli
from pulse_adapters.openclaw._settings import ModelSettings
from pulse_adapters.openclaw._store import AgentStore
from pulse_core import Clock, PulseError, Sample, Watcher


def _ok(sample: Sample) -> bool:
    return sample.ok and isinstance(sample.data, dict) and bool(sample.data.get("ok"))


def _changed_or_failing(window: Sequence[Sample]) -> bool:
    states = [_ok(s) for s in window[-2:]]
    return bool(states) and (not states[-1] or len(set(states)) > 1)


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)


class GatewayHealthWatcher(Watcher):
    """The gateway's unauthenticated HTTP probes on 127.0.0.1: `GET /health` (live: `ok`,
    `latency_ms`) and `GET /readyz` (`ready`, `failing`, the event loop's `degraded`). Wakes
    the tick when the gateway stops answering or comes back."""

    name = "openclaw-gateway"

    def __init__(self, port: int, *, interval_s: float = 5.0, timeout_s: float = 3.0) -> None:
        super().__init__()
        self.base_url = f"http://127.0.0.1:{port}"
        self.interval = interval_s
        self.timeout = 2 * timeout_s + 1.0
        self._http = httpx.AsyncClient(timeout=timeout_s)

    async def collect(self) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            live = await self._http.get(f"{self.base_url}/health")
        except httpx.HTTPError as exc:
            return {"ok": False, "latency_ms": _ms(started), "ready": None, "failing": [],
                    "error": f"GET /health: {type(exc).__name__}: {exc}"[:300]}
        latency = _ms(started)
        body = _json(live)
        ok = live.status_code == 200 and body.get("ok") is True
        reading: dict[str, Any] = {
            "ok": ok, "latency_ms": latency, "status": body.get("status"), "ready": None,
            "failing": [], "error": None if ok else f"GET /health answered HTTP "
                                                    f"{live.status_code}"}
        started = time.perf_counter()
        try:
            ready = await self._http.get(f"{self.base_url}/readyz")
        except httpx.HTTPError as exc:
            reading["ready_error"] = f"GET /readyz: {type(exc).__name__}"
            return reading
        details = _json(ready)
        loop = details.get("eventLoop")
        reading.update(ready=ready.status_code == 200 and details.get("ready") is not False,
                       ready_latency_ms=_ms(started), failing=details.get("failing") or [],
                       degraded=bool(loop.get("degraded")) if isinstance(loop, dict) else None)
        return reading

    def should_wake(self, window: Sequence[Sample]) -> bool:
        return _changed_or_failing(window)

    async def aclose(self) -> None:
        await self._http.aclose()


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


class SessionStoreWatcher(Watcher):
    """The agent's session store on disk: database, WAL and archive bytes, session counts."""

    name = "openclaw-sessions"

    def __init__(self, store: AgentStore, *, interval_s: float = 30.0) -> None:
        super().__init__()
        self.store = store
        self.interval = interval_s
        self.timeout = 10.0

    async def collect(self) -> dict[str, Any]:
        return await self.in_thread(self.store.sizes)


class RouteUnknown(PulseError):
    """The model route of the gateway could not be read from OpenClaw's config."""


class ModelRouteWatcher(Watcher):
    """The model route the gateway is configured with, probed by pulse_adapters.llm's
    RouteProbeWatcher and written under `route_key` (`llm-route`: llm_watchdog reads
    `data["ok"]`), with `provider` and `model` added. The route is read from OpenClaw's
    config at the first collect unless the settings give it."""

    name = "openclaw-model-route"

    def __init__(self, settings: ModelSettings, cli: OpenClawCli, agent: str,
                 clock: Clock) -> None:
        super().__init__()
        self.settings = settings
        self.cli = cli
        self.agent = agent
        self.clock = clock
        self.key = settings.route_key
        self.interval = settings.route_ttl_s
        self.timeout = settings.probe_timeout_s + 2 * cli.timeout_s + 1.0
        self.probe: RouteProbeWatcher | None = None
        self.route: dict[str, str] = {}

    async def discover(self) -> dict[str, str]:
        """The route: {"provider", "model", "base_url"}, from the settings or OpenClaw."""
        given = self.settings
        if given.base_url and given.model:
            return {"provider": "settings", "model": given.model, "base_url": given.base_url}
        agents = await self.cli.config_get("agents")
        agents = agents if isinstance(agents, dict) else {}
        entry = (agents.get("entries") or {}).get(self.agent) or {}
        chosen = entry.get("model") or (agents.get("defaults") or {}).get("model")
        ref = chosen.get("primary") if isinstance(chosen, dict) else chosen
        if not isinstance(ref, str) or "/" not in ref:
            raise RouteUnknown(f"OpenClaw's config names no model for agent {self.agent!r} "
                               "(agents.defaults.model.primary) — configure one, or set "
                               "layers.openclaw.model.base_url and .model")
        provider, _, model = ref.partition("/")
        providers = await self.cli.config_get("models.providers")
        found = providers.get(provider) if isinstance(providers, dict) else None
        base_url = given.base_url or (found or {}).get("baseUrl")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise RouteUnknown(f"OpenClaw's models.providers.{provider} has no baseUrl (a "
                               "built-in provider?) — set layers.openclaw.model.base_url, or "
                               "layers.openclaw.model.probe to false")
        return {"provider": provider, "model": given.model or model, "base_url": base_url}

    def _api_key(self) -> str | None:
        name = self.settings.api_key_env
        return None if name is None else (self.cli.env.get(name) or os.environ.get(name))

    async def collect(self) -> dict[str, Any]:
        if self.probe is None:
            self.route = await self.discover()
            timeout = self.settings.probe_timeout_s
            client = ChatClient(self.route["base_url"], self.route["model"], self._api_key(),
                                timeout_s=timeout, max_wall_s=2 * timeout)
            health = RouteHealth(client, key=self.key, ttl_s=self.interval, clock=self.clock,
                                 probe_timeout_s=timeout)
            self.probe = RouteProbeWatcher(health, interval_s=self.interval)
        reading = await self.probe.collect()
        return {**reading, "provider": self.route["provider"], "model": self.route["model"]}

    def should_wake(self, window: Sequence[Sample]) -> bool:
        return self.probe is not None and self.probe.should_wake(window)

    async def aclose(self) -> None:
        if self.probe is not None:
            await self.probe.health.client.aclose()
