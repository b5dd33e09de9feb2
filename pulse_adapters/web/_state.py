"""What every route of the UI shares: the engine it serves and what the UI keeps beside it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from pulse_adapters.web._book import FleetBook, LogBook
from pulse_adapters.web._metrics import EngineMetrics
from pulse_adapters.web._settings import WebSettings
from pulse_adapters.web._stream import Feed
from pulse_adapters.web._view import EngineView
from pulse_adapters.web._views import TickRate


@dataclass
class WebState:
    """The engine as the UI's process sees it, the UI's settings, its LogBook of the log,
    the Feed of its live streams, its metrics, its FleetBook of the engines sharing the log,
    and its tick-rate sampler."""

    engine: EngineView
    settings: WebSettings
    book: LogBook
    feed: Feed
    metrics: EngineMetrics
    fleet: FleetBook
    tick_rate: TickRate = field(default_factory=TickRate)
    rollback_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def home(self) -> Path:
        """The home the engine runs on."""
        return self.engine.home
