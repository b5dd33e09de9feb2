"""`upulse migrate --to URL`: a home's event log copied into an empty log of any installed
store backend (PostgreSQL, SQLite, a third party's) exactly, verified row by row, and (with
`--switch`) made the home's log.

The copy reads the home's log through its recorder's `rows()` (raw rows, data undecoded, so
an unreadable row is copied as it is) and writes them with the target recorder's
`copy_rows`, page by page, so a log of any size streams through a bounded amount of memory.
Every row is then read back from the target and compared, field by field, with the source,
and each key's version with the one its last row gives. Nothing of the home is written: the
source log is opened read-only and config.json changes only with `--switch`, after the
verification passed. The home lock is held throughout, so no daemon starts on the home
meanwhile (one that runs refuses the migration: stop it first); in the target, the `migrate`
exclusive section is held from before its emptiness check to the switch, so two migrations
into one empty log never both find it empty (the second is refused, told to leave the log
alone). Where a backend's exclusive sections do not reach other processes, the copy's first
page decides: `copy_rows` refuses rows that do not continue the log, so the second migration
writes nothing and is told the same.

Before anything is copied, the source is checked for what the target cannot take or a shared
log would misread: a text field holding a NUL character where the target's text cannot store
it (PostgreSQL), and, with `--switch`, effects not yet finished (decided on a log of the
home's own, they name no host, so any host's engine could run them once the log is shared).
Either refuses the migration before the target is touched. After the verified copy,
`--switch` restates the engine directory's last promote and rollback under the key of the
host the home is now bound to (pulse_cli.directory_log.carry_over), so rollback and
reconcile still find them.

Why `--switch` is asked for rather than implied: without it the command changes nothing
about how the home runs, so it doubles as a rehearsal that proves the target and times the
copy. With it, the switch happens under the same lock as the copy, so nothing can be written
to the old log between the copy and the switch; editing config.json by hand after a
rehearsal would lose what the home wrote since (the output says so).

What a URL names is asked of its backend (pulse_core.store's LogLocation): nothing here
knows a backend by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator

import msgspec

from pulse_cli import config as config_file
from pulse_cli.assembly import bound_host
from pulse_cli.directory_log import carry_over, event_key
from pulse_cli.home import CliError, Home, UsageError
from pulse_cli.migrate_verify import FIELDS, verify_copy
from pulse_cli.output import Progress, print_json, printable
from pulse_cli.stores import shown, store_url, unavailable
from pulse_core import (
    EffectIndex,
    EffectStatus,
    EventStore,
    PulseError,
    StoreError,
    write_private,
)
from pulse_core.store import LogLocation, open_event_store, parse_store_url

MISMATCHES_SHOWN = 10
NUL_SHOWN = 5
TEXT_FIELDS = ("id", "kind", "key", "origin", "tx", "idem", "hash")
UNFINISHED = (EffectStatus.PENDING, EffectStatus.EXECUTING, EffectStatus.RETRYING)


class MigrationRefused(CliError):
    """The target is not an empty log, or the source cannot be read or moved (a NUL
    character in a text field the target cannot store; with --switch, unfinished effects)."""


class MigrationMismatch(CliError):
    """The rows read back from the target differ from the source's: the copy is not exact."""


class Migration(msgspec.Struct):
    """What a migration did: where from and to (no passwords), how many events and keys were
    copied and verified, the rows that differ, whether config.json was switched, the
    unfinished effects that refuse a switch (0 where the source log is already shared), and
    the seqs of the events restating the engine directory's history under the host's key."""

    source: str
    target: str
    events: int = 0
    keys: int = 0
    verified: bool = False
    mismatches: list[str] = []
    switched: bool = False
    unfinished_effects: int = 0
    carried_over: list[int] = []
    copy_s: float = 0.0
    verify_s: float = 0.0


async def migrate(home: Home, *, to: str, switch: bool, page: int, as_json: bool) -> int:
    """Copy `home`'s log into the empty log at the store URL `to` (any installed backend),
    verify it, and with `switch` set config.json's store to `to`. Exit 0 when verified;
    MigrationMismatch (exit 1) when not; MigrationRefused (exit 1), before the target is
    touched, when the source cannot move (see the module's docstring); DaemonStateError
    (exit 3) while the daemon (or another engine) holds the home."""
    if switch:
        home.require()  # the switch writes config.json
    home.readable()
    cfg = config_file.load_or_default(home.config)
    source_url, target = store_url(home, cfg), _target(to)
    hosts = (bound_host(home.root, cfg),
             bound_host(home.root, dataclasses.replace(cfg, store=to)))
    done = Migration(source=shown(source_url), target=target.display())
    say = Progress(quiet=as_json)
    with home.held("migrate refused"):
        source = await _open(parse_store_url(source_url), source_url, read_only=True)
        try:
            if not hosts[0] and hosts[1]:  # the move binds the home to a host
                done.unfinished_effects = await _unfinished(source, done.source,
                                                           refuse=switch)
            if not target.text_holds_nul:
                await _refuse_nul(source, done.source, target.backend, page, say)
            sink = await _open(target, to, read_only=False)
            try:
                async with _only_migration(sink, done.target):
                    await _refuse_unless_empty(sink, done.target)
                    say(f"copying {await source.last_seq()} events from {done.source} to "
                        f"{done.target}")
                    started = time.monotonic()
                    done.events = await _copy(source, sink, page, say)
                    done.copy_s = time.monotonic() - started
                    done.keys, done.mismatches = await verify_copy(source, sink, done.events,
                                                               page, say)
                    done.verify_s = time.monotonic() - started - done.copy_s
                    done.verified = not done.mismatches
                    if done.verified and switch:
                        done.carried_over = await _carry_over(source, sink, *hosts)
                        _switch(home, to)
                        done.switched = True
            finally:
                await sink.close()
        finally:
            await source.close()
    _report(done, home, as_json)
    if not done.verified:
        raise MigrationMismatch(
            f"{len(done.mismatches)} row(s) or key(s) of {done.target} differ from "
            f"{done.source} ({'; '.join(done.mismatches[:3])}) — the home was not switched; "
            "empty that log (drop the database or schema, delete the file) and migrate "
            "again, and report this if it repeats")
    return 0


def _target(to: str) -> LogLocation:
    """The --to URL, read by its backend; UsageError when no installed backend can use it."""
    try:
        return parse_store_url(to)
    except StoreError as exc:
        raise UsageError(f"--to: {exc}") from None


async def _open(location: LogLocation, url: str, *, read_only: bool) -> EventStore:
    """The event store at `location` (read from `url`); MigrationRefused in one line
    (password cut) if it cannot be opened."""
    try:
        return await open_event_store(location, read_only=read_only)
    except StoreError as exc:
        raise MigrationRefused(unavailable(url, exc)) from None


async def _unfinished(source: EventStore, where: str, *, refuse: bool) -> int:
    """How many effects of `source` are unfinished (pending, executing, retrying); with
    `refuse`, MigrationRefused when there are any: they name no host, and once the log is
    shared any host's engine could run them (a restart of a process of this machine)."""
    index = EffectIndex(source, None)
    try:
        await index.refresh()
    except PulseError as exc:
        raise MigrationRefused(f"migrate refused: the effects in {where} cannot be read: "
                               f"{' '.join(str(exc).split())}") from None
    counts = {status: 0 for status in UNFINISHED}
    for entry in index.entries.values():
        counts[entry.status] = counts.get(entry.status, 0) + 1
    total = sum(counts.values())
    if refuse and total:
        states = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
        raise MigrationRefused(
            f"migrate refused: {total} effect(s) of this home are unfinished ({states}); "
            "decided on a log of the home's own, they name no host, so once other hosts share "
            "the log any of them could run them — drain them first: start the daemon, wait "
            "until `upulse effects --pending` lists none, stop it, and migrate again")
    return total


async def _refuse_nul(source: EventStore, where: str, backend: str, page: int,
                      say: Progress) -> None:
    """MigrationRefused, naming the first few seqs and fields, when a text field of a row
    of `source` holds a NUL character, which the target's `backend` cannot store."""
    found: list[str] = []
    count, after, total = 0, 0, await source.recorder.last_seq()
    say.hold()  # a check that lasts under a second prints nothing
    while rows := await source.recorder.rows(after, page):
        for row in rows:
            fields = [name for name in TEXT_FIELDS if "\0" in (getattr(row, name) or "")]
            if fields:
                count += 1
                if len(found) < NUL_SHOWN:
                    found.append(f"seq {row.seq} ({', '.join(fields)})")
        after = rows[-1].seq
        say.every(f"  checked {after}/{max(total, after)} events")
    say.drop()
    if count:
        more = f", and {count - len(found)} more" if count > len(found) else ""
        raise MigrationRefused(
            f"migrate refused: {count} event(s) of {where} hold a NUL character (\\x00), "
            f"which {backend} cannot store: {', '.join(found)}{more} — nothing was copied. "
            f"Stored events are never rewritten, so this log cannot move to {backend} as it "
            f"is: keep the home on it, or start a new home on {backend} (`upulse init "
            "--store URL`)")


async def _carry_over(source: EventStore, sink: EventStore, was: str, now: str) -> list[int]:
    """The seqs of the events restating, under the key of `now`, the engine directory's last
    promote and rollback recorded under the key of `was`; MigrationRefused when `sink` does
    not take them."""
    try:
        return [event.seq for event in await carry_over(source, sink, was, now)]
    except PulseError as exc:
        raise MigrationRefused(
            f"the copy was verified, but the engine directory's last promote and rollback "
            f"could not be restated under {event_key(now)}: {' '.join(str(exc).split())} — "
            "the home was not switched: empty that log (drop the database or schema, delete "
            "the file) and migrate again") from None


MIGRATION_LOCK = "migrate"
"""The exclusive section (Recorder.exclusive) a migration holds in its target, from before the
emptiness check to the switch: migrations into one log run one at a time."""
MIGRATION_WAIT_S = 5.0
"""How long a migration waits for another one into the same target before it refuses."""


class MigrationInProgress(MigrationRefused):
    """Another `upulse migrate` is copying into the same target right now."""


@contextlib.asynccontextmanager
async def _only_migration(sink: EventStore, where: str) -> AsyncIterator[None]:
    """Hold MIGRATION_LOCK in `sink` while inside; MigrationInProgress when another migration
    holds it for longer than MIGRATION_WAIT_S. Two migrations into one empty log would both
    find it empty, and the second's copy would then fail on the first's rows."""
    async with contextlib.AsyncExitStack() as held:
        try:
            async with asyncio.timeout(MIGRATION_WAIT_S):
                await held.enter_async_context(sink.recorder.exclusive(MIGRATION_LOCK))
        except TimeoutError:
            raise MigrationInProgress(
                f"migrate refused: another `upulse migrate` is copying into {where} right now "
                "— that log is the other migration's: leave it alone, and migrate this home "
                "into another empty log") from None
        except StoreError as exc:
            raise MigrationRefused(unavailable(where, exc)) from None
        yield


async def _refuse_unless_empty(sink: EventStore, where: str) -> None:
    held = await sink.recorder.last_seq()
    if held:
        raise MigrationRefused(
            f"{where} already holds {held} event(s) (seq 1 to {held}) — migrate copies into "
            "an empty log only: give the URL of a new one (on PostgreSQL a new database, "
            "`createdb NAME`, or another schema, ?schema=NAME; for SQLite a new file), and "
            "migrate into that")


async def _copy(source: EventStore, sink: EventStore, page: int, say: Progress) -> int:
    """Every row of `source` after the last copied, into `sink`, `page` rows at a time,
    until `source` has no more; the number of rows copied. MigrationRefused, saying what
    the target now holds, when a store fails halfway; MigrationInProgress when the first
    page is refused because something else filled the target since it was found empty."""
    total, after = await source.recorder.last_seq(), 0
    try:
        while rows := await source.recorder.rows(after, page):
            await sink.recorder.copy_rows(rows)
            after = rows[-1].seq
            total = max(total, after)
            say.every(f"  copied {after}/{total} events ({100 * after // max(total, 1)}%)")
    except StoreError as exc:
        if after == 0 and await _filled(sink):
            raise MigrationInProgress(
                f"migrate refused: something else (another `upulse migrate`?) wrote into "
                f"{sink.recorder.location} since it was found empty, and nothing of this "
                "home was copied — that log is not this migration's: leave it alone, and "
                "migrate this home into another empty log") from None
        raise MigrationRefused(
            f"the copy stopped after seq {after}: {' '.join(str(exc).split())} — the target "
            "now holds part of the log: empty it (drop the database or schema, delete the "
            "file) and migrate again into an empty one") from None
    say.flush()
    return after


async def _filled(sink: EventStore) -> bool:
    """Whether `sink` holds events (False when it cannot even say)."""
    try:
        return await sink.recorder.last_seq() > 0
    except StoreError:
        return False


def _switch(home: Home, url: str) -> None:
    """Set config.json's `store` to `url`, keeping every other setting as written."""
    raw = msgspec.json.decode(home.config.read_bytes())
    raw["store"] = url
    text = msgspec.json.format(msgspec.json.encode(raw), indent=2) + b"\n"
    config_file.parse_config(text, str(home.config))  # what the daemon will load
    write_private(home.config, text)


def _report(done: Migration, home: Home, as_json: bool) -> None:
    if as_json:
        print_json(done)
        return
    if not done.verified:
        print(printable(f"NOT verified: {done.target} differs from {done.source}:"))
        for line in done.mismatches[:MISMATCHES_SHOWN]:
            print(printable(f"  {line}"))
        return
    print(printable(
        f"verified: {done.events} events and {done.keys} keys in {done.target} match "
        f"{done.source} field for field ({', '.join(FIELDS)}); copied in {done.copy_s:.1f} s, "
        f"verified in {done.verify_s:.1f} s"))
    if done.carried_over:
        print(printable(
            f"carried over: the engine directory's last promote and rollback, restated under "
            f"the host's key as seq {', '.join(map(str, done.carried_over))}, so `upulse "
            "rollback` and reconcile find them"))
    if done.switched:
        print(printable(f"switched: {home.config} names {done.target} as the event log; "
                        f"{done.source} is kept as it was (the engine no longer reads it)"))
    else:
        if done.unfinished_effects:
            print(printable(
                f"{done.unfinished_effects} unfinished effect(s): --switch refuses until they "
                "are finished (start the daemon, wait until `upulse effects --pending` lists "
                "none, stop it)"))
        print(printable(
            f"not switched: {home.root} still runs on {done.source}. This copy is a snapshot "
            "— pointing config.json at it by hand would lose what the home writes from now "
            "on; to move the home, migrate into an empty database again with --switch"))
