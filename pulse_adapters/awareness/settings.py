"""The awareness layer's settings: which model to ask, how to reach it, and how to review.

In config.json they are the object under `"layers": {"awareness": {...}}`; in Python an
`AwarenessSettings(...)`. The API key itself never appears in either: `api_key_env` names the
environment variable that holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from pulse_adapters.awareness.config import AwarenessConfig, AwarenessConfigError
from pulse_adapters.llm import ModelEndpoint
from pulse_core import LayerError, settings_problem

LAYER = "awareness"
"""The layer's name, in config.json and in the `pulse.layers` entry-point group."""

class AwarenessSettingsError(LayerError):
    """A setting of the awareness layer is missing or wrong; the message names the field."""


def _bad(field: str, problem: str) -> AwarenessSettingsError:
    return AwarenessSettingsError(f"layer {LAYER!r}: setting `{field}` {problem}")


class AwarenessSettings(ModelEndpoint, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Where the reviewer's model is (a ModelEndpoint: `base_url` and `model` required) and
    how to review: `review` holds cadence, quiet time, evidence bounds, budgets and
    degradation (`AwarenessConfig`).
    """

    review: AwarenessConfig = msgspec.field(default_factory=AwarenessConfig)

    def __post_init__(self) -> None:
        problem = self.endpoint_problem(required=True)
        if problem is not None:
            raise _bad(*problem)

    def api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The API key from the variable `api_key_env` names (in `environ`, default the
        process environment); None when no variable is named; AwarenessSettingsError when
        the variable is unset or empty."""
        problem = self.key_problem(environ)
        if problem is not None:
            raise _bad("api_key_env", problem)
        return super().api_key(environ)


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
