"""What this engine runs, after pulse's survival and built-in rules: the four public lists.

The loader reads RULES, WATCHERS, EXECUTORS and PROJECTIONS from here. A reload (after
`upulse promote` or `upulse rollback`) swaps RULES between two ticks; changes to the other
lists take effect when the daemon restarts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pulse_core import Executor, Projection, Rule, Watcher

from .executors.notes import NoteExecutor
from .rules.inbox import inbox_note
from .watchers.inbox import InboxWatcher

HOME = Path(__file__).resolve().parent.parent
"""The home folder this engine directory lives in (engine/ and staging/ sit inside it)."""

RULES: list[Rule] = [inbox_note]
WATCHERS: list[Watcher] = [InboxWatcher(HOME / "inbox")]
EXECUTORS: list[Executor] = [NoteExecutor(HOME / "notes.md")]
PROJECTIONS: list[Projection[Any]] = []
