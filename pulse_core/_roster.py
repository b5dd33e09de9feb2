"""Which effect types each host's engines run, as the hosts announce them.

An engine records `executors-announced` as it opens (key `executors@<host>`; data: host,
tags, owner); the latest announcement of each host counts. A loop with no executor for an
effect leaves it to the hosts that announced its type, and fails it for good only when none
did: hosts running different layers never fail each other's effects.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from pulse_core._events import EventDraft, ExecutorsAnnounced
from pulse_core.store import EventStore

ANNOUNCED = "executors-announced"
PAGE = 1_000


def announcement(host: str, owner: str, tags: Iterable[str]) -> EventDraft:
    """The `executors-announced` event by which the engine `owner` of `host` says it runs
    effects of `tags`."""
    body = ExecutorsAnnounced(host, sorted(set(tags)), owner)
    return EventDraft(ANNOUNCED, f"executors@{host}", msgspec.to_builtins(body),
                      origin="engine")


class Roster:
    """The effect tags each host runs, by the latest announcement of each host in `store`,
    read on from where the last `refresh` ended."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.tags: dict[str, frozenset[str]] = {}
        self._cursor = 0

    async def refresh(self) -> None:
        """Fold the announcements committed since the last refresh."""
        async for page in self.store.pages(self._cursor, kinds=[ANNOUNCED], limit=PAGE):
            for event in page.events:
                try:
                    body = msgspec.convert(event.data, ExecutorsAnnounced)
                except msgspec.ValidationError:
                    continue  # written by another version, or badly: it announces nothing
                self.tags[body.host] = frozenset(body.tags)
            # the next read starts where this one ended: the log's head, as it saw it
            self._cursor = page.last_seq if len(page.events) < PAGE else page.events[-1].seq

    def runners(self, tag: str, host: str = "") -> list[str]:
        """The hosts that run effects of `tag` (only `host`, when the effect is bound to it)."""
        return sorted(h for h, tags in self.tags.items()
                      if tag in tags and (not host or h == host))

    def describe(self) -> str:
        """Every announcing host and the tags it runs, for an error message."""
        return "; ".join(f"{host}: {', '.join(sorted(tags)) or 'none'}"
                         for host, tags in sorted(self.tags.items())) or "none"

    def unhandled(self, effect_id: str, tag: str, bound_to: str, host: str,
                  handled: Iterable[str]) -> str:
        """The error that fails effect `effect_id` of `tag` (bound to host `bound_to`, if
        not ''), which `host` has no executor for and no host announced."""
        bound = f" (bound to host {bound_to})" if bound_to else ""
        return (f"no executor handles effect {tag!r}{bound} on any host of this log: {host} runs "
                f"{', '.join(sorted(handled)) or 'none'}; hosts announced: {self.describe()} — "
                f"start an engine whose layers run {tag!r}, then `upulse effects retry "
                f"{effect_id}`")
