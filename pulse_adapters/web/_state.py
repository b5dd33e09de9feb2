"""What every route of the UI shares: the engine it serves and what the UI keeps beside it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from pulse_adapters.web._book import LogBook
from pulse_adapters.web._settings import WebSettings
from pulse_adapters.web._views import TickRate
from pulse_core import Engine, EngineDirectory


@dataclass
class WebState:
    """The running engine, the UI's settings, the engine directory (None without one), the
    UI's LogBook of the log, and its tick-rate sampler."""

    engine: Engine
    settings: WebSettings
    book: LogBook
    directory: EngineDirectory | None = None
    tick_rate: TickRate = field(default_factory=TickRate)
    rollback_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def home(self) -> Path:
        """The home the engine runs on."""
        return self.engine.home
