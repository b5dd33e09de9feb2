"""`upulse export`: the events of a home's log as JSON lines, oldest first (docs/backup.md).

Each line is one stored event encoded as it is (`pulse_core.Event`: seq, id, kind, key,
version, ts, origin, cause, tx, idem, data, hash), so `msgspec.json.decode(line,
type=Event)` gives it back. The log is read page by page through the store face (any
backend, read-only), so a log of any size streams through a bounded amount of memory; the
events after the last page's read are not included (run again with --since to continue).
"""

from __future__ import annotations

import os
import sys

import msgspec

from pulse_cli.home import Home
from pulse_cli.stores import opened


async def export(home: Home, *, since: int, kinds: list[str] | None, page: int) -> int:
    """Write every event of `home`'s log after seq `since` (only `kinds`, when given) to
    stdout as one JSON line each; exit 0."""
    encoder = msgspec.json.Encoder()
    out = sys.stdout.buffer
    async with opened(home, read_only=True) as stores:
        try:
            async for found in stores.events.pages(since, kinds=kinds, limit=page):
                if found.events:
                    out.write(b"".join(encoder.encode(e) + b"\n" for e in found.events))
                    out.flush()
        except BrokenPipeError:  # the reader stopped (`| head`): so does the export
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
