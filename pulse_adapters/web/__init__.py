"""The web layer: a live UI of a running engine, its operator's controls, and /metrics.

Switched on by config.json (`"layers": {"web": {}}`), the daemon serves it on
http://127.0.0.1:8421/ (docs/web.md); `upulse ui` prints the address with the token. Every
request passes the Guard: a Host the UI answers to, not from another site, with the token of
HOME/ui.token.

The settings and the home's files are light to import (the CLI reads them); the server, the
app and the metrics load when first named.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pulse_adapters.web._settings import (
    LAYER,
    TOKEN_FILE,
    TokenMissing,
    WebSettings,
    WebSettingsError,
    ensure_token,
    load_settings,
    read_token,
    served_address,
    token_path,
)
from pulse_adapters.web._socket import listen_on
from pulse_core import Layer, LayerContext, publish_face

if TYPE_CHECKING:
    from pulse_adapters.web._app import build_app
    from pulse_adapters.web._guard import Guard, allowed_hosts
    from pulse_adapters.web._metrics import (
        EngineMetrics,
        InstrumentReadings,
        InstrumentTally,
        log_exposition,
    )
    from pulse_adapters.web._pages import configured_metrics
    from pulse_adapters.web._service import WebService

__all__ = [
    "LAYER",
    "TOKEN_FILE",
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
    "configured_metrics",
    "ensure_token",
    "layer",
    "listen_on",
    "load_settings",
    "log_exposition",
    "read_token",
    "served_address",
    "token_path",
]

_LAZY = {"build_app": "_app", "Guard": "_guard", "allowed_hosts": "_guard",
         "EngineMetrics": "_metrics", "InstrumentReadings": "_metrics",
         "InstrumentTally": "_metrics", "log_exposition": "_metrics",
         "WebService": "_service", "configured_metrics": "_pages"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    found = globals()[name] = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    publish_face(__name__, [name])
    return found


def layer(settings: Any, context: LayerContext) -> Layer:
    """The web layer (entry point `web` in group `pulse.layers`): one service, the UI."""
    from pulse_adapters.web._service import WebService

    return Layer(LAYER, services=[WebService(context.home, load_settings(settings),
                                             context.engine_directory)])


publish_face(__name__, [name for name in __all__ if name not in _LAZY])
