"""The awareness layer's settings: which model to ask, how to reach it, and how to review.

In config.json they are the object under `"layers": {"awareness": {...}}`; in Python an
`AwarenessSettings(...)`. The API key itself never appears in either: `api_key_env` names the
environment variable that holds it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from pulse_adapters.awareness.config import AwarenessConfig, AwarenessConfigError
from pulse_core import LayerError, settings_problem

LAYER = "awareness"
"""The layer's name, in config.json and in the `pulse.layers` entry-point group."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class AwarenessSettingsError(LayerError):
    """A setting of the awareness layer is missing or wrong; the message names the field."""


def _bad(field: str, problem: str) -> AwarenessSettingsError:
    return AwarenessSettingsError(f"layer {LAYER!r}: setting `{field}` {problem}")


class AwarenessSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Where the reviewer's model is and how to review.

    `base_url` ends in the API version (`http://127.0.0.1:8080/v1`); `api_key_env` is the NAME
    of the environment variable holding the API key (None: no Authorization header, which
    local servers accept). `timeout_s` and `max_wall_s` bound each silence of the server and a
    whole call; `route_ttl_s` is how often the route is probed and how long a verdict stands;
    `probe_timeout_s` bounds one probe. `review` holds cadence, quiet time, evidence bounds,
    budgets and degradation (`AwarenessConfig`).
    """

    base_url: str
    model: str
    api_key_env: str | None = None
    timeout_s: float = 60.0
    max_wall_s: float = 180.0
    route_ttl_s: float = 30.0
    probe_timeout_s: float = 5.0
    review: AwarenessConfig = msgspec.field(default_factory=AwarenessConfig)

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise _bad("base_url", f"must start with http:// or https:// (got "
                                   f"{self.base_url!r}), e.g. 'http://127.0.0.1:8080/v1'")
        if not self.model.strip():
            raise _bad("model", "must name a model the server serves, e.g. 'qwen2.5-7b-instruct'")
        if self.api_key_env is not None and not _ENV_NAME.match(self.api_key_env):
            raise _bad("api_key_env", "must be the NAME of an environment variable (letters, "
                                      "digits, _; e.g. OPENAI_API_KEY), not the key itself")
        for name in ("timeout_s", "max_wall_s", "route_ttl_s", "probe_timeout_s"):
            if getattr(self, name) <= 0:
                raise _bad(name, f"must be > 0 seconds (got {getattr(self, name)!r})")

    def api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The API key from the variable `api_key_env` names (in `environ`, default the
        process environment); None when no variable is named."""
        if self.api_key_env is None:
            return None
        value = (os.environ if environ is None else environ).get(self.api_key_env)
        if not value:
            raise _bad("api_key_env", f"names the environment variable {self.api_key_env}, "
                                      "which is not set or empty — export it where the engine "
                                      "runs, or drop api_key_env for a server that needs no key")
        return value


def load_settings(settings: Any) -> AwarenessSettings:
    """`settings` as AwarenessSettings: one already, or config.json's object for the layer.

    Raises AwarenessSettingsError naming the field that is missing, unknown or wrong.
    """
    if isinstance(settings, AwarenessSettings):
        return settings
    if settings is None:
        raise AwarenessSettingsError(
            f"layer {LAYER!r} needs settings: at least base_url and model, e.g. "
            '{"base_url": "http://127.0.0.1:8080/v1", "model": "qwen2.5-7b-instruct"}')
    if not isinstance(settings, Mapping):
        raise AwarenessSettingsError(f"layer {LAYER!r}: settings must be a JSON object, not "
                                     f"{type(settings).__name__}")
    if "api_key" in settings:
        raise _bad("api_key", "is not accepted: the key never goes in config.json — put it in "
                              "an environment variable and name that variable in api_key_env")
    try:
        return msgspec.convert(dict(settings), AwarenessSettings)
    except msgspec.ValidationError as exc:
        problem = settings_problem(AwarenessSettings, exc)
        raise AwarenessSettingsError(f"layer {LAYER!r}: {problem}") from None
    except AwarenessConfigError as exc:
        raise _bad(f"review.{exc.field}", exc.problem) from None
