"""`upulse metrics`: the engine's metrics in Prometheus' text format (docs/metrics.md).

From the daemon's web service when it serves (its /metrics, with the home's token: every
family), else read from the home's log, opened read-only (the families the log holds, with
those of the layers config.json names).
"""

from __future__ import annotations

import sys

import httpx

from pulse_adapters.web import configured_metrics, log_exposition, read_token, served_address
from pulse_cli.home import Home
from pulse_cli.output import printable
from pulse_cli.stores import opened

FETCH_TIMEOUT_S = 10.0
"""How long `upulse metrics` waits for the daemon's /metrics before reading the log."""


async def metrics(home: Home) -> int:
    """Print the metrics of `home`: the running daemon's /metrics when its web service
    serves, else the families of the home's log. A web service that does not answer is
    named on stderr, and the log is read instead."""
    url = served_address(home.root)
    if url is not None:
        try:
            text = await _scrape(f"{url.rstrip('/')}/metrics", read_token(home.root))
        except httpx.HTTPError as exc:
            print(f"upulse: warning: the web service at {url} did not answer /metrics "
                  f"({printable(str(exc) or type(exc).__name__)}); reading the log instead",
                  file=sys.stderr)
        else:
            sys.stdout.buffer.write(text)
            return 0
    metrics = configured_metrics(home.root)
    async with opened(home.readable(), read_only=True) as stores:
        sys.stdout.buffer.write(await log_exposition(stores, metrics))
    return 0


async def _scrape(url: str, token: str) -> bytes:
    async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S, trust_env=False) as client:
        response = await client.get(url, headers={"Authorization": f"Bearer {token}"})
        response.raise_for_status()
        return response.content
