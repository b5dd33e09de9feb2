"""The cursor layer: coding tasks from the task board run by Cursor's CLI (`agent -p
--output-format stream-json`) in each agent's repository folder (docs/cursor.md)."""

from pulse_adapters.cursor._executor import CursorExecutor, CursorRun
from pulse_adapters.cursor._layer import MIN_VERSION, CursorLayer, build_cursor, layer
from pulse_adapters.cursor._settings import (
    LAYER,
    CursorAgent,
    CursorSettings,
    CursorSettingsError,
    load_settings,
)
from pulse_adapters.cursor._stream import CursorOutcome, parse_stream
from pulse_core import publish_face

__all__ = [
    "LAYER",
    "MIN_VERSION",
    "CursorAgent",
    "CursorExecutor",
    "CursorLayer",
    "CursorOutcome",
    "CursorRun",
    "CursorSettings",
    "CursorSettingsError",
    "build_cursor",
    "layer",
    "load_settings",
    "parse_stream",
]

publish_face(__name__)
