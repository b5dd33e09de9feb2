"""The web layer's settings and its two files in a home: the token and the served address.

In config.json the settings are the object under `"layers": {"web": {...}}`; every field has
a default, so `"web": {}` serves on http://127.0.0.1:8421/. The token that guards every
request lives in HOME/ui.token (0600), written by `upulse init` (or by the layer when it is
missing); the address the running service listens on is in HOME/web.json (0600) while it
serves.
"""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from pulse_core import LayerError, settings_problem, write_private

LAYER = "web"
"""The layer's name, in config.json and in the `pulse.layers` entry-point group."""

TOKEN_FILE = "ui.token"
ADDRESS_FILE = "web.json"
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{32,128}$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9.-]{1,253}(:\d{1,5})?$")


class WebSettingsError(LayerError):
    """A setting of the web layer is wrong; the message names the field."""


class TokenMissing(LayerError):
    """HOME/ui.token is missing or unreadable: the UI cannot be reached without it."""


class WebSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Where the UI listens and which names it answers to.

    `host` is the address to bind (default loopback only; binding another address exposes
    the UI, token-guarded, to that network). `port` 0 picks a free port (HOME/web.json and
    `upulse ui` tell which). `allowed_hosts` adds Host header values the UI answers to
    besides 127.0.0.1, localhost and [::1] on its port (the name a reverse proxy forwards);
    any other Host is refused, which stops DNS-rebinding pages from reading it.
    `live_every_s` is how often live pages get a fresh overview. `request_timeout_s` is how
    long a client may take to send a whole request before it is disconnected.
    """

    host: str = "127.0.0.1"
    port: int = 8421
    allowed_hosts: tuple[str, ...] = ()
    live_every_s: float = 1.0
    request_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            raise _bad("host", f"must be an IP address to bind, e.g. '127.0.0.1' (got "
                               f"{self.host!r})") from None
        if not 0 <= self.port <= 65535:
            raise _bad("port", f"must be 0..65535 (got {self.port})")
        for name in self.allowed_hosts:
            if not _HOST_NAME.match(name):
                raise _bad("allowed_hosts", f"holds {name!r}, which is not a host name "
                                            "(optionally with :port)")
        if not 0.1 <= self.live_every_s <= 60:
            raise _bad("live_every_s", f"must be 0.1..60 seconds (got {self.live_every_s})")
        if not 0.5 <= self.request_timeout_s <= 300:
            raise _bad("request_timeout_s",
                       f"must be 0.5..300 seconds (got {self.request_timeout_s})")


def _bad(field: str, problem: str) -> WebSettingsError:
    return WebSettingsError(f"layer {LAYER!r}: setting `{field}` {problem}")


def load_settings(settings: Any) -> WebSettings:
    """`settings` as WebSettings: one already, None (every default) or config.json's object.

    Raises WebSettingsError naming the field that is unknown or wrong."""
    if isinstance(settings, WebSettings):
        return settings
    if settings is None:
        return WebSettings()
    if not isinstance(settings, Mapping):
        raise WebSettingsError(f"layer {LAYER!r}: settings must be a JSON object, not "
                               f"{type(settings).__name__}")
    try:
        return msgspec.convert(dict(settings), WebSettings)
    except msgspec.ValidationError as exc:
        problem = settings_problem(WebSettings, exc)
        if problem.startswith("unknown field"):
            raise WebSettingsError(f"layer {LAYER!r}: {problem}") from None
        message, at, where = str(exc).rpartition(" - at `$.")
        if at:
            raise _bad(where.rstrip("`").split("[")[0], f"is wrong: {message}") from None
        raise WebSettingsError(f"layer {LAYER!r}: {exc}") from None


def token_path(home: Path) -> Path:
    """HOME/ui.token."""
    return Path(home) / TOKEN_FILE


def ensure_token(home: Path) -> str:
    """The home's UI token, generated (256 random bits, file 0600) when there is none."""
    path = token_path(home)
    if path.exists():
        return read_token(home)
    token = secrets.token_urlsafe(32)
    write_private(path, token.encode() + b"\n")
    return token


def read_token(home: Path) -> str:
    """The home's UI token; TokenMissing says how to make one when there is none."""
    path = token_path(home)
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise TokenMissing(f"{path} does not exist — `upulse init` makes it (re-running init "
                           "on an existing home keeps everything else)") from None
    except OSError as exc:
        raise TokenMissing(f"cannot read the UI token {path}: {exc} — check its owner and "
                           "mode (0600, the engine's user)") from exc
    if not _TOKEN.match(token):
        raise TokenMissing(f"{path} does not hold a token (32-128 URL-safe characters) — "
                           "delete it and run `upulse init` again to make a new one")
    return token


def address_path(home: Path) -> Path:
    """HOME/web.json."""
    return Path(home) / ADDRESS_FILE


def served_address(home: Path) -> str | None:
    """The URL the home's web service listens on ('http://127.0.0.1:8421/'), None when it
    does not serve (no HOME/web.json, or the process that wrote it is gone)."""
    import psutil

    try:
        found = json.loads(address_path(home).read_text())
        url, pid = found["url"], found["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(url, str) or not isinstance(pid, int) or not psutil.pid_exists(pid):
        return None
    return url
