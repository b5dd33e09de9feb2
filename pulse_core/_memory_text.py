"""Which memory fields are element text, sealed when appended, and opening them for a reader
(pulse_core/store/_keys.py seals; docs/memory.md, "Purge erases")."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from pulse_core.store import ElementKeys, reveal, seal_fields

if TYPE_CHECKING:
    from pulse_core.memory import IdentityMemory

for _kind, _fields in (
    ("human-exchange", ("text",)), ("state-set", ("value",)),
    ("state-revised", ("value", "reason")), ("unresolved-opened", ("text",)),
    ("temporal-fact-recorded", ("text",)), ("reflection-recorded", ("text",)),
):
    seal_fields(_kind, *_fields)


def reveal_memory(memory: IdentityMemory, keys: ElementKeys | None) -> IdentityMemory:
    """`memory` with its sealed text opened with `keys` (text whose element was purged reads
    as PURGED_TEXT); ElementTextUnreadable names an element whose key is missing or changed.
    Blocking (one keys.db read per sealed value): call it off the event loop."""
    replace = msgspec.structs.replace
    return replace(
        memory,
        exchanges=tuple(replace(x, text=reveal(x.text, keys)) for x in memory.exchanges),
        state={k: replace(v, value=reveal(v.value, keys)) for k, v in memory.state.items()},
        unresolved={k: replace(v, text=reveal(v.text, keys))
                    for k, v in memory.unresolved.items()},
        observations={k: replace(v, value=reveal(v.value, keys))
                      for k, v in memory.observations.items()},
        facts={k: replace(v, text=reveal(v.text, keys)) for k, v in memory.facts.items()},
        reflection=None if memory.reflection is None
        else replace(memory.reflection, text=reveal(memory.reflection.text, keys)))
