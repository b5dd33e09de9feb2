"""The web layer: a live UI of a running engine, its operator's controls, and /metrics.

Switched on by config.json (`"layers": {"web": {}}`), the daemon serves it on
http://127.0.0.1:8421/ (docs/web.md); `upulse ui` prints the address with the token. Every
request passes the Guard: a Host the UI answers to, not from another site, with the token of
HOME/ui.token.
"""

from __future__ import annotations

from typing import Any

from pulse_adapters.web._app import build_app
from pulse_adapters.web._guard import Guard, allowed_hosts
from pulse_adapters.web._metrics import (
    EngineMetrics,
    InstrumentReadings,
    InstrumentTally,
    log_exposition,
)
from pulse_adapters.web._service import WebService
from pulse_adapters.web._settings import (
    LAYER,
    TokenMissing,
    WebSettings,
    WebSettingsError,
    ensure_token,
    load_settings,
    read_token,
    served_address,
)
from pulse_core import Layer, LayerContext

__all__ = [
    "EngineMetrics",
    "Guard",
    "InstrumentReadings",
    "InstrumentTally",
    "TokenMissing",
    "WebService",
    "WebSettings",
    "WebSettingsError",
    "allowed_hosts",
    "build_app",
    "ensure_token",
    "layer",
    "load_settings",
    "log_exposition",
    "read_token",
    "served_address",
]


def layer(settings: Any, context: LayerContext) -> Layer:
    """The web layer (entry point `web` in group `pulse.layers`): one service, the UI."""
    return Layer(LAYER, services=[WebService(context.home, load_settings(settings),
                                             context.engine_directory)])
