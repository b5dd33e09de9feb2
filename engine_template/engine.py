"""What this engine runs, after pulse's survival layer, its built-in rules and the layers
the home's config.json names: one layer, made by `layer(settings, context)`.

The loader calls `layer` whenever it builds an engine: with this directory's config.json as
`settings`, and `context.home`, the home the engine runs on. Every path comes from there,
never from this file's location: under `upulse dev`, `upulse tick` and the promote gate the
engine runs on a scratch copy of the home, and reads and writes that copy. A reload (after
`upulse promote`, `upulse rollback`, SIGHUP or a save under `upulse dev`) builds the whole
layer again: rules, watchers, executors and projections alike.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pulse_core import Layer, LayerContext

from .executors.notes import NoteExecutor
from .rules.inbox import inbox_note
from .watchers.inbox import InboxWatcher


class Settings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """This engine's settings in config.json; paths are relative to the home. A field this
    layer does not know is refused, so a typo never passes silently."""

    inbox: str = "inbox"
    notes: str = "notes.md"


def layer(settings: Any, context: LayerContext) -> Layer:
    """This engine's layer for the home `context.home`, configured by `settings`."""
    paths = msgspec.convert(settings or {}, Settings)
    return Layer(
        "engine",
        rules=[inbox_note],
        watchers=[InboxWatcher(context.home / paths.inbox)],
        executors=[NoteExecutor(context.home / paths.notes)],
        projections=[],
    )
