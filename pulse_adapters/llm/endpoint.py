"""Where a model is and how to reach it: the one settings struct every layer that calls a
model extends (awareness, maintenance's consolidation, the OpenClaw and Hermes routes)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping

import msgspec

from pulse_adapters.llm.client import ChatClient
from pulse_adapters.llm.health import ROUTE_KEY, RouteHealth
from pulse_core import Clock

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ModelEndpoint(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An OpenAI-compatible model route.

    `base_url` ends in the API version (`http://127.0.0.1:8080/v1`) and `model` names a model
    it serves; `api_key_env` is the NAME of the environment variable holding the key (None: no
    Authorization header, which local servers accept). `timeout_s` bounds each silence of
    the server and `max_wall_s` a whole call. The route is probed every `route_ttl_s` (a
    verdict stands that long), each probe within `probe_timeout_s`, into vitals `route_key`.
    """

    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 60.0
    max_wall_s: float = 180.0
    route_key: str = ROUTE_KEY
    route_ttl_s: float = 30.0
    probe_timeout_s: float = 5.0

    def endpoint_problem(self, *, required: bool) -> tuple[str, str] | None:
        """(field, what is wrong with it) for the first bad field, else None; with
        `required`, `base_url` and `model` must be given (a `model` given is never blank)."""
        if self.base_url is None:
            if required:
                return "base_url", ("is missing: give the server's URL, e.g. "
                                    "'http://127.0.0.1:8080/v1'")
        elif not self.base_url.startswith(("http://", "https://")):
            return "base_url", (f"must start with http:// or https:// (got {self.base_url!r}), "
                                "e.g. 'http://127.0.0.1:8080/v1'")
        if (required or self.model is not None) and not (self.model or "").strip():
            return "model", "must name a model the server serves, e.g. 'qwen2.5-7b-instruct'"
        if self.api_key_env is not None and not _ENV_NAME.fullmatch(self.api_key_env):
            return "api_key_env", ("must be the NAME of an environment variable (letters, "
                                   "digits, _; e.g. OPENAI_API_KEY), not the key itself")
        if not self.route_key.strip():
            return "route_key", f"must name a vitals key (the survival layer reads {ROUTE_KEY!r})"
        for name in ("timeout_s", "max_wall_s", "route_ttl_s", "probe_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                return name, f"must be a finite number > 0 seconds (got {value!r})"
        return None

    def api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The key in the variable `api_key_env` names (in `environ`, default the process
        environment); None when none is named or it is unset or empty."""
        if self.api_key_env is None:
            return None
        return (os.environ if environ is None else environ).get(self.api_key_env) or None

    def key_problem(self, environ: Mapping[str, str] | None = None) -> str | None:
        """What is wrong with `api_key_env` where the engine runs (it names a variable that
        is unset or empty), else None."""
        if self.api_key_env is None or ModelEndpoint.api_key(self, environ) is not None:
            return None
        return (f"names the environment variable {self.api_key_env}, which is not set or "
                "empty — export it where the engine runs, or drop api_key_env for a server "
                "that needs no key")

    def client(self, api_key: str | None = None) -> ChatClient:
        """A ChatClient for this route (`api_key` default: `api_key()`); `base_url` and
        `model` must be set."""
        if self.base_url is None or self.model is None:
            raise ValueError("a model route needs base_url and model to make a client")
        return ChatClient(self.base_url, self.model,
                          self.api_key() if api_key is None else api_key,
                          timeout_s=self.timeout_s, max_wall_s=self.max_wall_s)

    def route_health(self, client: ChatClient, clock: Clock) -> RouteHealth:
        """The route's health over `client`: probed every `route_ttl_s` into `route_key`."""
        return RouteHealth(client, key=self.route_key, ttl_s=self.route_ttl_s, clock=clock,
                           probe_timeout_s=self.probe_timeout_s)
