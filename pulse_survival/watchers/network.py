"""network: DNS resolution (dnspython) and HTTP GETs (httpx) to configured targets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import dns.asyncresolver
import dns.exception
import dns.resolver
import httpx

from pulse_core import Sample, Watcher, redact_urls
from pulse_survival.config import NetworkTargets


def network_outage(data: Any) -> bool:
    """Whether one network sample shows an outage: every configured kind (DNS, HTTP) failing.

    With both configured that is DNS and HTTP both down; with one, that one; with none, never.
    """
    if not isinstance(data, dict):
        return False
    configured = [data.get(k) for k in ("dns_ok", "http_ok") if data.get(k) is not None]
    return bool(configured) and not any(configured)


class NetworkWatcher(Watcher):
    """Resolves each DNS name and GETs each URL; records ok, latency and error per target.

    `dns_ok` / `http_ok` say whether any target of that kind answered (None: none configured).
    """

    name = "network"

    def __init__(self, targets: NetworkTargets) -> None:
        super().__init__()
        self.targets = targets
        self.interval = targets.interval_s
        self.timeout = targets.timeout_s * 2 + 1
        self._client: httpx.AsyncClient | None = None

    def _resolver(self) -> dns.asyncresolver.Resolver:
        if not self.targets.dns_servers:
            resolver = dns.asyncresolver.Resolver()
        else:
            resolver = dns.asyncresolver.Resolver(configure=False)
            resolver.nameservers = list(self.targets.dns_servers)
            resolver.port = self.targets.dns_port
        resolver.lifetime = self.targets.timeout_s
        return resolver

    async def _dns(self, resolver: dns.asyncresolver.Resolver, name: str) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            answer = await resolver.resolve(name, "A")
            addresses = sorted(r.to_text() for r in answer)
            return {"ok": True, "latency_ms": _ms(started), "answers": addresses}
        except (dns.exception.DNSException, OSError) as exc:
            return {"ok": False, "latency_ms": _ms(started),
                    "error": f"{type(exc).__name__}: {exc}"[:300]}

    async def _http(self, client: httpx.AsyncClient, url: str) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            response = await client.get(url)
        except httpx.HTTPError as exc:
            return {"ok": False, "latency_ms": _ms(started),
                    "error": redact_urls(f"{type(exc).__name__}: {exc}")[:300]}
        ok = response.status_code < 500
        out: dict[str, Any] = {"ok": ok, "latency_ms": _ms(started),
                               "status": response.status_code}
        if not ok:
            out["error"] = f"HTTP {response.status_code}"
        return out

    async def collect(self) -> dict[str, Any]:
        if not self.targets.dns_names and not self.targets.http_urls:
            return {"dns": {}, "http": {}, "dns_ok": None, "http_ok": None}
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.targets.timeout_s,
                                             follow_redirects=False)
        resolver = self._resolver()
        dns_results, http_results = await asyncio.gather(
            asyncio.gather(*[self._dns(resolver, n) for n in self.targets.dns_names]),
            asyncio.gather(*[self._http(self._client, u) for u in self.targets.http_urls]),
        )
        dns_map = dict(zip(self.targets.dns_names, dns_results, strict=True))
        http_map = dict(zip(self.targets.http_urls, http_results, strict=True))
        return {
            "dns": dns_map, "http": http_map,
            "dns_ok": any(r["ok"] for r in dns_map.values()) if dns_map else None,
            "http_ok": any(r["ok"] for r in http_map.values()) if http_map else None,
        }

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def should_wake(self, window: Sequence[Sample]) -> bool:
        states = [network_outage(s.data) for s in window[-2:] if s.ok]
        return len(states) == 2 and states[0] != states[1]


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)
