"""inbox_note: when new messages arrive in the inbox, leave a note saying how many wait."""

from __future__ import annotations

import msgspec

from pulse_core import Decision, Inner, Snapshot, emits

from ..executors.notes import Note
from ..types import InboxReading


def inbox_count(snapshot: Snapshot) -> int:
    """Messages in the inbox as `snapshot` saw it (0 before the first reading, or on error)."""
    reading = snapshot.vital("inbox")
    if reading is None or not reading.sample.ok:
        return 0
    return msgspec.convert(reading.sample.data, InboxReading).count


@emits(Note)
async def inbox_note(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    """Decorate the inner decision: when the inbox grew since the last tick, add a Note."""
    effects, tick_ms = await inner(prev, curr)
    count = inbox_count(curr)
    if count > inbox_count(prev):
        effects = [*effects, Note(text=f"{count} message(s) waiting in the inbox")]
    return Decision(effects, tick_ms)
