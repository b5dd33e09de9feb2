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

from pulse_core import Sample, Watcher
from pulse_survival.config import NetworkTargets


def network_state(data: Any) -> tuple[bool, bool]:
    """(dns_ok, http_ok) of one network sample; a kind with no targets counts as ok."""
    if not isinstance(data, dict):
        return True, True
    return bool(data.get("dns_ok", True)), bool(data.get("http_ok", True))


class NetworkWatcher(Watcher):
    """Resolves each DNS name and GETs each URL; records ok, latency and error per target."""

    name = "network"

    def __init__(self, targets: NetworkTargets) -> None:
        super().__init__()
        self.targets = targets
        self.interval = targets.interval_s
        self.timeout = targets.timeout_s * 2 + 1

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
                    "error": f"{type(exc).__name__}: {exc}"[:300]}
        ok = response.status_code < 500
        out: dict[str, Any] = {"ok": ok, "latency_ms": _ms(started),
                               "status": response.status_code}
        if not ok:
            out["error"] = f"HTTP {response.status_code}"
        return out

    async def collect(self) -> dict[str, Any]:
        resolver = self._resolver()
        async with httpx.AsyncClient(timeout=self.targets.timeout_s,
                                     follow_redirects=False) as client:
            dns_results, http_results = await asyncio.gather(
                asyncio.gather(*[self._dns(resolver, n) for n in self.targets.dns_names]),
                asyncio.gather(*[self._http(client, u) for u in self.targets.http_urls]),
            )
        dns_map = dict(zip(self.targets.dns_names, dns_results, strict=True))
        http_map = dict(zip(self.targets.http_urls, http_results, strict=True))
        return {
            "dns": dns_map, "http": http_map,
            "dns_ok": not dns_map or any(r["ok"] for r in dns_map.values()),
            "http_ok": not http_map or any(r["ok"] for r in http_map.values()),
        }

    def should_wake(self, window: Sequence[Sample]) -> bool:
        states = [network_state(s.data) for s in window[-2:] if s.ok]
        return len(states) == 2 and states[0] != states[1]


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)
