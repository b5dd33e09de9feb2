"""The world fingerprint: what must change for a review to be worth a model call."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import msgspec

from pulse_core.memory import IdentityMemory

NUMBER = "<number>"
TIMESTAMP = "<timestamp>"
_TIMESTAMP = re.compile(
    r"^(\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?"
    r"|\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?)$"
)
_is_timestamp = _TIMESTAMP.match


def shape(value: Any) -> Any:
    """A routine value with its jitter removed: numbers and timestamp-like strings become
    placeholders; booleans, other strings (enums), nulls and structure are kept. A dict's
    keys become strings, in the value's order (the fingerprint's encoding sorts them)."""
    kind = type(value)  # the plain JSON types first: observed values are decoded JSON
    if kind is str:
        text = value.strip()
        return TIMESTAMP if text[:1].isdigit() and _is_timestamp(text) else value
    if kind is int or kind is float:
        return NUMBER
    if kind is dict:
        shaped: dict[str, Any] = {}
        for k, v in value.items():
            shaped[k if type(k) is str else str(k)] = shape(v)
        return shaped
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return NUMBER
    if isinstance(value, str):
        return TIMESTAMP if _is_timestamp(value.strip()) else value
    if isinstance(value, dict):
        return {str(k): shape(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [shape(v) for v in value]
    return repr(type(value))


def _digest(value: Any) -> str:
    return hashlib.sha256(msgspec.json.encode(value, order="sorted")).hexdigest()


def fingerprint(memory: IdentityMemory, *, reviewer_origin: str = "executor:awareness") -> str:
    """SHA-256 of the latest human exchange id and the observations' sorted projection.

    Observations are reduced to the latest per (source, key); timestamps never take part;
    above-routine ones count by a hash of their literal value, routine ones by `shape`.
    Observations the reviewer itself recorded are left out, so its own settlement never makes
    the world look changed.
    """
    human = memory.last_human
    latest: dict[tuple[str, str], Any] = {}
    for obs in memory.observations.values():
        if obs.origin == reviewer_origin:
            continue
        value = shape(obs.value) if obs.routine else _digest(obs.value)
        latest[(obs.source, obs.key)] = [obs.source, obs.key, obs.severity, obs.routine, value]
    projection = [latest[k] for k in sorted(latest)]
    return _digest([human.record if human else None, projection])
