"""A migrated log read back: every row of the target compared, field by field, with the
source's, and every key's version with its last row's (`upulse migrate`)."""

from __future__ import annotations

from pulse_cli.output import Progress
from pulse_core import EventStore
from pulse_core.store import StoredRow

FIELDS = tuple(StoredRow.__struct_fields__)


async def verify_copy(source: EventStore, sink: EventStore, copied: int, page: int,
                  say: Progress) -> tuple[int, list[str]]:
    """Every row of `sink` compared, field by field, with `source`'s, and every key's version
    in `sink` with the version of its last row; the number of keys and what differs."""
    differ: list[str] = []
    versions: dict[str, int] = {}
    after = 0
    while True:
        theirs = await sink.recorder.rows(after, page)
        ours = await source.recorder.rows(after, len(theirs) or 1)
        if not theirs and not ours:
            break
        if not theirs:
            differ.append(f"the source has events after seq {after} that were not copied: "
                          "something appended to it during the migration (a `upulse task` "
                          "command, a program embedding an engine)")
            break
        if len(ours) != len(theirs):
            differ.append(f"after seq {after}: {len(ours)} row(s) in the source, "
                          f"{len(theirs)} in the target")
            break
        for mine, copy in zip(ours, theirs, strict=True):
            if mine != copy:
                differ.append(difference(mine, copy))
            versions[mine.key] = mine.version
        after = ours[-1].seq
        say.every(f"  verified {after}/{copied} events")
    if after != copied:
        differ.append(f"{after} rows read back, {copied} copied")
    say.flush()
    for key, version in versions.items():
        head = await sink.recorder.head(key)
        if head != version:
            differ.append(f"key {key!r} is at version {head} in the target, {version} in "
                          "the source")
    return len(versions), differ


def difference(mine: StoredRow, copy: StoredRow) -> str:
    """Which fields of the row at `mine.seq` differ in its copy."""
    fields = [name for name in FIELDS if getattr(mine, name) != getattr(copy, name)]
    return f"seq {mine.seq}: {', '.join(fields)} differ"
