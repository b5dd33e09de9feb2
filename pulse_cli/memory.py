"""`upulse memory list|show|exchange|recall`: read the agent's memory, recall from it, and
feed it an exchange for the awareness reviewer, without Python (docs/memory.md, "From the
shell", "Recall").

`list`, `show` and `recall` open the home read-only (they never write and never wait for a running
daemon) and read through pulse_core's memory read model, as the web UI does. `exchange`
appends through pulse_core.MemoryBoard; SQLite's WAL lets it write while the daemon runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pulse_cli import config as config_file
from pulse_cli.home import CliError, Home, UsageError
from pulse_cli.maintenance import import_origins
from pulse_cli.output import (
    ago,
    clip,
    did_you_mean,
    now_ms,
    print_json,
    print_table,
    printable,
    table,
    to_json,
)
from pulse_cli.stores import opened
from pulse_core import (
    MAX_KEY_LENGTH,
    IdentityRecords,
    InvalidEvent,
    Memory,
    MemoryBoard,
    check_text,
    identity_key,
    read_identities,
    read_identity,
)
from pulse_core.memory import (
    Exchange,
    RecallQuery,
    RecallRefused,
    UnknownIdentity,
)
from pulse_core.memory import (
    recall as recall_memory,
)

_LIST_HEADERS = ("IDENTITY", "NAME", "EXCH", "STATE", "UNRES", "OBS", "FACTS", "REFL",
                   "REMOVED", "LAST EXCHANGE")


async def list_identities(home: Home, *, as_json: bool) -> int:
    """Print every identity with memory: its record counts and its newest exchange."""
    async with opened(home, read_only=True) as stores:
        identities = await read_identities(stores.events)
    if as_json:
        print_json(identities)
        return 0
    now = now_ms()
    rows = [[s.identity, s.name or "-", s.counts.exchanges, s.counts.state, s.counts.unresolved,
             s.counts.observations, s.counts.facts, s.counts.reflections, s.counts.removed,
             _last(s.last_exchange, now)] for s in identities]
    print_table(_LIST_HEADERS, rows, "no identities in this home's memory (`upulse memory "
                                       "exchange IDENTITY TEXT` records one)")
    return 0


def _last(exchange: Exchange | None, now: int) -> str:
    if exchange is None:
        return "-"
    return f"{ago(exchange.ts, now)}, {exchange.role}: {clip(exchange.text, 50)}"


async def show(home: Home, *, identity: str, as_json: bool) -> int:
    """Print one identity's records; CliError naming the nearest known identity when the
    log holds no memory of `identity`."""
    async with opened(home, read_only=True) as stores:
        records = await read_identity(stores.events, identity)
        if records is None:
            known = [s.identity for s in await read_identities(stores.events)]
            raise CliError(_unknown(identity, known))
    if as_json:
        print_json(records)
    else:
        print(_shown(records, now_ms()))
    return 0


def _unknown(identity: str, known: Sequence[str]) -> str:
    problem = f"no identity {identity!r} in this home's memory"
    if not known:
        return (f"{problem}, nor any other yet — `upulse memory exchange {identity} TEXT` "
                "records an exchange with it")
    return problem + (did_you_mean(identity, known) or " — `upulse memory list` lists them")


def _section(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]],
             total: int | None = None) -> str:
    """A titled, indented table (`title: none` without rows); `total`, for rows listed
    newest first, is how many there are in all."""
    if not rows:
        return f"{title}: none"
    if total is not None:
        title += ", newest first" + (f" ({len(rows)} of {total})" if total > len(rows) else "")
    return f"{title}:\n" + _indented(table(headers, rows))


def _indented(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def _by(who: str | None, at: int | None, now: int) -> str:
    return "-" if who is None else f"{who}, {ago(at, now)}"


def _shown(r: IdentityRecords, now: int) -> str:
    """One identity's records for people: a heading, then a section per record type."""
    name = f" ({printable(r.name)})" if r.name else ""
    parts = [f"{printable(r.identity)}{name}: memory version {r.version}"]
    parts.append(_section(
        "exchanges", ("WHEN", "ROLE", "BY", "TEXT"),
        [[ago(x.at, now), x.role, x.by, clip(x.text, 70)] for x in r.exchanges],
        r.counts.exchanges))
    parts.append(_section(
        "state", ("ITEM", "VALUE", "CONFIDENCE", "SET", "REVISED"),
        [[clip(s.item, 30), clip(to_json(s.value), 40),
          f"{s.confidence:.2f}{' protected' if s.protected else ''}",
          _by(s.set_by, s.set_at, now),
          _by(s.revised_by, s.revised_at, now)
          + (f" ({clip(s.revision_reason, 40)})" if s.revision_reason else "")]
         for s in r.state]))
    parts.append(_section(
        "unresolved", ("PRIORITY", "OPENED", "TEXT"),
        [[u.priority, _by(u.opened_by, u.opened_at, now), clip(u.text, 70)]
         for u in r.unresolved]))
    parts.append(_section(
        "observations",
        ("WHEN", "SOURCE", "KEY", "SEVERITY", "BY", "VALUE"),
        [[ago(o.at, now), clip(o.source, 20), clip(o.key, 30), o.severity, o.by,
          clip(to_json(o.value), 50)] for o in r.observations], r.counts.observations))
    parts.append(_section(
        "facts", ("RECORDED", "VALID", "TEXT"),
        [[_by(f.by, f.at, now), _span(f.valid_from, f.valid_until), clip(f.text, 70)]
         for f in r.facts], r.counts.facts))
    reflection = r.reflection
    parts.append("reflection: none" if reflection is None else
                 f"reflection ({_by(reflection.by, reflection.at, now)}):\n  "
                 f"{clip(reflection.text, 200)}")
    parts.append(_section(
        "forgotten or quarantined",
        ("RECORD", "WAS", "HOW", "WHEN", "BY", "REASON"),
        [[x.record, x.was or "-", x.how, ago(x.at, now), x.by, clip(x.reason, 50)]
         for x in r.removed], r.counts.removed))
    return "\n".join(parts)


def _span(start: int | None, end: int | None) -> str:
    """A fact's span of validity in UTC dates."""
    if start is None and end is None:
        return "always"
    return f"{_date(start) if start is not None else '…'} to " \
           f"{_date(end) if end is not None else '…'}"


def _date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _checked(identity: str, text: str) -> None:
    """UsageError, before anything is written, for an exchange the log would refuse or
    that says nothing."""
    if not identity.strip():
        raise UsageError("IDENTITY is empty — give the id of who the exchange is with "
                         "(like ana)")
    if not text.strip():
        raise UsageError(f"TEXT is empty — give what was said to or by {identity!r}")
    if len(identity_key(identity)) > MAX_KEY_LENGTH:
        raise UsageError(f"IDENTITY is {len(identity)} characters long; an identity's key "
                         f"({identity_key('')}ID) holds at most {MAX_KEY_LENGTH} — give a "
                         "shorter id")
    try:
        check_text(identity, "IDENTITY", "memory exchange")
        check_text(text, "TEXT", "memory exchange")
    except InvalidEvent as exc:
        raise UsageError(str(exc)) from None


async def exchange(home: Home, *, identity: str, text: str, role: str, as_json: bool) -> int:
    """Record an exchange with `identity` (`role` human or agent), registering the identity
    first when the log holds no memory of it; a human exchange makes it due for an
    awareness review. UsageError, with nothing written, for an empty IDENTITY or TEXT."""
    _checked(identity, text)
    async with opened(home, read_only=False) as stores:
        board = MemoryBoard(stores.events, origin="cli")
        new = not await stores.events.read(kinds=Memory.kinds, key=identity_key(identity),
                                           limit=1)
        if new:
            await board.register(identity)
        event = await board.exchange(identity, text, role)
    if as_json:
        print_json(event)
    else:
        print(printable(f"{role} exchange {event.data['record']} with {identity} recorded "
                        f"(event #{event.seq}{'; a new identity' if new else ''})"))
    return 0


_RECALL_HEADERS = ("IDENTITY", "RECORD", "TYPE", "STAGE", "AUTH", "CONF", "STRENGTH", "WHEN",
                   "TEXT")


async def recall(home: Home, *, identity: str | None, topic: str | None, text: str | None,
                 limit: int, archived: bool, as_json: bool) -> int:
    """Print what the agent recalls (pulse_core.memory.recall), best first, imports ranked as
    the home's maintenance settings name them (`imports.origins`). UsageError for a
    malformed query (naming the field); CliError naming the nearest known identity for an
    identity the log holds no memory of."""
    query = RecallQuery(identity=identity, topic=topic, text=text, limit=limit,
                        include_archived=archived)
    cfg = config_file.load_or_default(home.readable().config)
    origins = import_origins(cfg)
    async with opened(home, read_only=True, cfg=cfg) as stores:
        try:
            found = await recall_memory(stores.events, query, import_origins=origins)
        except UnknownIdentity as exc:
            known = [s.identity for s in await read_identities(stores.events)]
            raise CliError(_unknown(exc.identity, known)) from None
        except RecallRefused as exc:
            raise UsageError(f"{exc} ({exc.field})") from None
    if as_json:
        print_json(found)
        return 0
    now = now_ms()
    rows = [[r.identity, r.record, r.type, r.stage, r.authority, f"{r.confidence:.2f}",
             f"{r.strength:.2f}", ago(r.at, now), clip(r.text, 60)] for r in found]
    print_table(_RECALL_HEADERS, rows, "nothing recalled")
    return 0
