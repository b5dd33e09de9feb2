"""What this engine runs, after pulse's survival layer, its built-in rules and the layers
config.json names: one layer.

The loader reads LAYER from here. A reload (after `upulse promote`, `upulse rollback`, SIGHUP
or a save under `upulse dev`) builds the whole engine again from this layer and config.json:
rules, watchers, executors and projections alike.
"""

from __future__ import annotations

from pathlib import Path

from pulse_core import Layer

from .executors.notes import NoteExecutor
from .rules.inbox import inbox_note
from .watchers.inbox import InboxWatcher

HOME = Path(__file__).resolve().parent.parent
"""The home folder this engine directory lives in (engine/ and staging/ sit inside it)."""

LAYER = Layer(
    "engine",
    rules=[inbox_note],
    watchers=[InboxWatcher(HOME / "inbox")],
    executors=[NoteExecutor(HOME / "notes.md")],
    projections=[],
)
