"""The engine directory's record in the event log: its `promote` and `rollback` events, and
the log agreeing with main.

Each home records its promotes and rollbacks under a key of its own, and reads that key only
(`event_key`): `engine-directory@<host>`, naming the host, where hosts share one log
(PostgreSQL), so one host's promote never puts another's main out of step with the log;
`engine-directory` in a log of its own (SQLite). A home whose log moves to PostgreSQL
(`upulse migrate --switch`) keeps its history there through `carry_over`.

A process that stops between an event and git leaves the log naming a revision main is not
at; `reconcile_held` (and pulse_cli.enginedir.reconcile, which takes HOME/engine-dir.lock
for it) appends a `rollback` event saying where main is. The git side is
pulse_cli.enginedir's and pulse_cli.rollback's.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from pulse_cli.git import git, is_ancestor
from pulse_core import Event, EventDraft, EventStore, open_home

EVENT_KEY = "engine-directory"
"""The key of promote and rollback events in a log of one home's own (see event_key)."""


def event_key(host: str) -> str:
    """The key of the promote and rollback events of the engine directory bound to `host`
    (pulse_core._assembly.placement: '' for a log of its own): EVENT_KEY alone for '',
    `engine-directory@<host>` where engines of several hosts share the log."""
    return f"{EVENT_KEY}@{host}" if host else EVENT_KEY


def directory_event(kind: str, data: dict[str, object], host: str, origin: str) -> EventDraft:
    """A `promote` or `rollback` event of the engine directory bound to `host`: under
    event_key(host), naming the host in its data unless it is '' (pulse_core.host_of reads
    it, so another host's survival ledger leaves the event alone)."""
    return EventDraft(kind, event_key(host), {**data, "host": host} if host else data,
                      origin=origin)


async def last_recorded(log: EventStore, host: str, kinds: list[str]) -> Event | None:
    """The latest event of `kinds` (promote, rollback) recorded for the engine directory
    bound to `host`; None when it has none."""
    found = await log.read(kinds=kinds, key=event_key(host), limit=1, newest_first=True)
    return found[0] if found else None


async def carry_over(source: EventStore, target: EventStore, from_host: str, to_host: str,
                     origin: str = "cli") -> list[Event]:
    """Restate in `target`, under the key of `to_host`, the last `promote` recorded in
    `source` under the key of `from_host`, then the last `rollback` if one came after it;
    the events appended ([] when the keys are one, or nothing was recorded). Each has the
    kind and data of the one it restates, naming `to_host`, and `migrated_from` (that one's
    seq): reconcile and rollback read it as they read the original."""
    promoted = await last_recorded(source, from_host, ["promote"])
    last = await last_recorded(source, from_host, ["promote", "rollback"])
    restated = {e.seq: e for e in (promoted, last) if e is not None}
    if event_key(from_host) == event_key(to_host) or not restated:
        return []
    drafts = [directory_event(e.kind, {**{k: v for k, v in e.data.items() if k != "host"},
                                       "migrated_from": e.seq}, to_host, origin)
              for e in sorted(restated.values(), key=lambda e: e.seq)
              if isinstance(e.data, dict)]
    return list((await target.append(drafts)).events) if drafts else []


@contextlib.asynccontextmanager
async def event_log(root: Path, events: EventStore | None, store: str | None, *,
               read_only: bool) -> AsyncIterator[EventStore]:
    """`events`; without it the log of the home `root` at the store URL `store`, opened for
    this use only (`read_only`: nothing is written)."""
    if events is not None:
        yield events
        return
    stores = await open_home(root, store=store, read_only=read_only)
    try:
        yield stores.events
    finally:
        await stores.close()


# -- the log and main agree --------------------------------------------------------------------


async def record_main(log: EventStore, main: str, reason: str, origin: str,
                      host: str) -> None:
    """A `rollback` event (of `host`'s engine directory) saying that main is (still) at
    `main`, and why: it sets the log's word on what runs right without changing git (kept
    null, staging untouched)."""
    await log.append([directory_event("rollback",
                                      {"revision": main, "to": main, "reason": reason,
                                       "kept": None, "staging": "untouched"}, host, origin)])


async def _disagreement(engine: Path, log: EventStore, main: str, host: str) -> str | None:
    """Why the last promote or rollback recorded for `host`'s engine directory does not name
    `main`; None when it does (or when nothing was recorded for it yet)."""
    recorded = await last_recorded(log, host, ["promote", "rollback"])
    data = recorded.data if recorded is not None else None
    said = data.get("revision") if isinstance(data, dict) else None
    if recorded is None or not isinstance(said, str) or said == main:
        return None
    if recorded.kind == "promote" and not await is_ancestor(engine, said, main):
        return (f"a promote to {said} was recorded but main never moved (the process stopped "
                "in between)")
    return (f"the log last recorded main at {said} but it is at {main}: main moved without "
            f"an event (a rollback that stopped before recording it, or a commit made in "
            f"{engine} by hand)")


async def reconcile_log(engine: Path, log: EventStore, main: str, origin: str,
                        host: str) -> str | None:
    """`reconcile_held` on a log already open for writing, with main's HEAD `main` read
    already."""
    reason = await _disagreement(engine, log, main, host)
    if reason is not None:
        await record_main(log, main, reason, origin, host)
    return reason


async def reconcile_held(engine: Path, events: EventStore | None, store: str | None,
                         origin: str, *, host: str = "") -> str | None:
    """`reconcile` (pulse_cli.enginedir) for a caller that holds HOME/engine-dir.lock
    already; the log is opened for writing only when it disagrees with main."""
    main = await git(engine, "rev-parse", "HEAD")
    async with event_log(engine.parent, events, store, read_only=True) as log:
        if events is not None:
            return await reconcile_log(engine, log, main, origin, host)
        reason = await _disagreement(engine, log, main, host)
    if reason is not None:
        async with event_log(engine.parent, None, store, read_only=False) as log:
            await record_main(log, main, reason, origin, host)
    return reason
