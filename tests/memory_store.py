"""A third store backend, kept in this process's memory: the example of a backend added
without editing pulse. It is reached only through pulse's public faces, and registered the
way any distribution registers one (tests/conftest.py's `memory_backend` fixture writes the
distribution's metadata)::

    [project.entry-points."pulse.stores"]
    memory = "tests.memory_store:parse_memory_url"

    [project.entry-points."pulse.side_stores"]
    memory = "tests.memory_store:parse_memory_side_url"

`memory://NAME` names one log (or side store) in this process; opening the name again opens
the same one, as a second process opens the same file or database.
tests/core/test_store_plugin.py runs the store contract suite against the log.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from pulse_core import (
    Clock,
    Event,
    IdempotencyConflict,
    StoreClosed,
    StoreError,
    StoreReadOnly,
    SystemClock,
    VersionConflict,
)
from pulse_core.store import AppendResult, Page, PreparedAppend, Recorder, StoredRow


@dataclass
class MemoryLog:
    """One log: its rows in seq order (seq n at index n - 1), each key's version, and the
    row each idempotency key names."""

    rows: list[StoredRow] = field(default_factory=list)
    heads: dict[str, int] = field(default_factory=dict)
    by_idem: dict[str, StoredRow] = field(default_factory=dict)

    def add(self, rows: Sequence[StoredRow]) -> None:
        self.rows.extend(rows)
        for row in rows:
            self.heads[row.key] = row.version
            if row.idem is not None:
                self.by_idem[row.idem] = row


LOGS: dict[str, MemoryLog] = {}
"""Every memory log of this process, by name."""


class MemoryURL(NamedTuple):
    """A `memory://NAME` store URL: a LogLocation."""

    name: str

    @property
    def backend(self) -> str:
        return "memory"

    @property
    def file(self) -> Path | None:
        return None

    @property
    def spans_hosts(self) -> bool:
        return False

    @property
    def text_holds_nul(self) -> bool:
        return True

    def display(self) -> str:
        return f"memory://{self.name}"

    async def open(self, *, read_only: bool, clock: Clock | None) -> Recorder:
        if read_only and self.name not in LOGS:
            raise StoreError(f"{self.display()} does not exist: there is no event log to read")
        log = LOGS.setdefault(self.name, MemoryLog())
        return MemoryRecorder(self.display(), log, read_only, clock or SystemClock())


def parse_memory_url(url: str) -> MemoryURL:
    """The log a `memory://NAME` URL names; StoreError without a name."""
    name = urlsplit(url).netloc
    if not name:
        raise StoreError(f"store URL {url!r}: name the log, as in memory://main")
    return MemoryURL(name)


class MemoryRecorder(Recorder):
    """The Recorder contract over a MemoryLog. Each call runs to its end without awaiting,
    so on one event loop every insert is one transaction."""

    def __init__(self, location: str, log: MemoryLog, read_only: bool, clock: Clock) -> None:
        self.location = location
        self.read_only = read_only
        self.clock = clock
        self._log: MemoryLog | None = log

    def _open_log(self) -> MemoryLog:
        if self._log is None:
            raise StoreClosed(f"{self.location}: used after close")
        return self._log

    def _writable_log(self) -> MemoryLog:
        if self.read_only:
            raise StoreReadOnly(f"{self.location}: opened read-only, so writes are refused")
        return self._open_log()

    async def insert(self, append: PreparedAppend) -> AppendResult:
        log = self._writable_log()
        stored: list[Event | None] = [None] * len(append.drafts)
        for index, draft in enumerate(append.drafts):
            prior = None if draft.idem is None else log.by_idem.get(draft.idem)
            if prior is None:
                continue
            if (prior.kind, prior.key, prior.data) != (draft.kind, draft.key, draft.data):
                raise IdempotencyConflict(draft.idem or "", prior.seq)
            stored[index] = prior.event()
        if append.drafts and all(event is not None for event in stored):
            return AppendResult(append.tx, tuple(e for e in stored if e is not None), True)
        for key, expected in append.expect.items():
            if log.heads.get(key, 0) != expected:
                raise VersionConflict(key, expected, log.heads.get(key, 0))
        now, seq, versions = self.clock.now_ms(), len(log.rows) + 1, dict(log.heads)
        rows: list[StoredRow] = []
        events: list[Event] = []
        for draft, prior_event in zip(append.drafts, stored, strict=True):
            if prior_event is not None:
                events.append(prior_event)
                continue
            versions[draft.key] = versions.get(draft.key, 0) + 1
            row = StoredRow(seq, draft.id, draft.kind, draft.key, versions[draft.key], now,
                            draft.origin, draft.cause, append.tx, draft.idem, draft.data,
                            draft.hash)
            rows.append(row)
            events.append(row.event())
            seq += 1
        log.add(rows)
        return AppendResult(append.tx, tuple(events), False)

    async def select(self, after_seq: int = 0, *, kinds: Sequence[str] | None = None,
                     key: str | None = None, limit: int | None = None,
                     newest_first: bool = False, origin_prefix: str | None = None) -> Page:
        log = self._open_log()
        found = [row for row in log.rows[after_seq:]
                 if (kinds is None or row.kind in kinds) and (key is None or row.key == key)
                 and (origin_prefix is None or row.origin.startswith(origin_prefix))]
        if newest_first:
            found.reverse()
        return Page.of(found[:limit], len(log.rows))

    async def head(self, key: str) -> int:
        return self._open_log().heads.get(key, 0)

    async def last_seq(self) -> int:
        return len(self._open_log().rows)

    async def rows(self, after_seq: int, limit: int) -> list[StoredRow]:
        return self._open_log().rows[after_seq:after_seq + limit]

    async def copy_rows(self, rows: Iterable[StoredRow]) -> int:
        log = self._writable_log()
        given = list(rows)
        if not given:
            return 0
        seqs = [row.seq for row in given]
        if seqs != list(range(seqs[0], seqs[0] + len(seqs))):
            gap = next(b for a, b in itertools.pairwise(seqs) if b != a + 1)
            raise StoreError(f"{self.location}: rows to copy jump to seq {gap} — copy a log "
                             "whole, its seqs consecutive")
        if seqs[0] != len(log.rows) + 1:
            raise StoreError(f"{self.location}: the rows to copy start at seq {seqs[0]} but "
                             f"this log ends at seq {len(log.rows)} — copy into an empty log")
        log.add(given)
        return len(given)

    async def close(self) -> None:
        self._log = None


SIDES: dict[str, dict[tuple[str, str], tuple[bytes, int | None]]] = {}
"""Every memory side store of this process, by name: (namespace, key) -> (value, expiry)."""


class MemorySideURL(NamedTuple):
    """A `memory://NAME` side-store URL: a SideLocation."""

    name: str

    @property
    def file(self) -> Path | None:
        return None

    def display(self) -> str:
        return f"memory://{self.name}"

    async def open(self, *, read_only: bool, clock: Clock | None) -> MemorySideStore:
        return MemorySideStore(self, SIDES.setdefault(self.name, {}), read_only,
                               clock or SystemClock())


def parse_memory_side_url(url: str) -> MemorySideURL:
    """The side store a `memory://NAME` URL names; StoreError without a name."""
    name = urlsplit(url).netloc
    if not name:
        raise StoreError(f"side-store URL {url!r}: name the store, as in memory://hold")
    return MemorySideURL(name)


class MemorySideStore:
    """The SideStore protocol over a dict, expiring by `clock`."""

    def __init__(self, url: MemorySideURL, values: dict[tuple[str, str], tuple[bytes, int | None]],
                 read_only: bool, clock: Clock) -> None:
        self.url, self.read_only, self.clock = url, read_only, clock
        self._values: dict[tuple[str, str], tuple[bytes, int | None]] | None = values

    def _open_values(self, *, write: bool = False
                     ) -> dict[tuple[str, str], tuple[bytes, int | None]]:
        if self._values is None:
            raise StoreClosed(f"{self.url.display()}: used after close")
        if write and self.read_only:
            raise StoreReadOnly(f"{self.url.display()}: opened read-only")
        return self._values

    async def get_all(self, namespace: str) -> dict[str, bytes]:
        now = self.clock.now_ms()
        return {key: value for (space, key), (value, expires) in self._open_values().items()
                if space == namespace and (expires is None or expires > now)}

    async def put(self, namespace: str, items: Mapping[str, bytes],
                  ttl_ms: int | None = None) -> None:
        values = self._open_values(write=True)
        expires = None if ttl_ms is None else self.clock.now_ms() + ttl_ms
        values.update(((namespace, key), (bytes(value), expires))
                      for key, value in items.items())

    async def delete(self, namespace: str, keys: Iterable[str]) -> None:
        values = self._open_values(write=True)
        for key in keys:
            values.pop((namespace, key), None)

    async def close(self) -> None:
        self._values = None
