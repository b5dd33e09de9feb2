"""`upulse events|effects|tasks|vitals` (read the log) and `upulse task ...` (append to it).

Reads open the home read-only (pulse_core._home.open_home), so they never write and never
wait for a running daemon. Task commands append through pulse_core.TaskBoard with the
task's expected version; SQLite's WAL lets them write while the daemon runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator
from importlib.metadata import entry_points
from typing import Any

import msgspec

from pulse_cli.home import CliError, Home, UsageError
from pulse_cli.output import (
    ago,
    clip,
    did_you_mean,
    now_ms,
    print_json,
    print_json_line,
    print_table,
    printable,
    to_json,
)
from pulse_cli.stores import opened
from pulse_core import (
    EFFECT_KINDS,
    TASK_KINDS,
    EffectEntry,
    EffectStatus,
    Event,
    EventStore,
    EventUnreadable,
    InvalidTransition,
    TaskBoard,
    TaskState,
    UnreadableEvent,
    VersionConflict,
    fold_effect,
    known_kinds,
    next_task_state,
)

_DURATION = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
TASK_STATUSES = ("pending", "assigned", "executing", "acked", "closed", "given-up")
KINDS_SUGGESTED_FROM = 10_000  # the newest events whose kinds a typo is compared with


class Since(msgspec.Struct, frozen=True):
    """Where a listing starts: after an event seq, or a duration back from now."""

    seq: int | None = None
    seconds: float | None = None


def parse_since(text: str) -> Since:
    """`--since` as an argparse type: `120` (after seq 120) or `90s`, `10m`, `2h`, `1d`."""
    if text.isdigit():
        return Since(seq=int(text))
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give an event seq (like 120) or a duration (like 90s, 10m, 2h, 1d)")
    return Since(seconds=float(match["n"]) * _UNIT_S[match["unit"]])


def parse_duration(text: str) -> float:
    """A duration such as `90s`, `10m`, `2h` or `1d`, in seconds (an argparse type)."""
    since = parse_since(text)
    if not since.seconds:
        raise argparse.ArgumentTypeError(f"{text!r}: give a duration like 90s, 10m, 2h or 1d")
    return since.seconds


def parse_count(text: str) -> int:
    """A count of 0 or more (an argparse type)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, 0 or more")
    return int(text)


def parse_page(text: str) -> int:
    """A page size from 1 to 100,000 (an argparse type)."""
    if not text.isdigit() or not 1 <= int(text) <= 100_000:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 1 to 100000")
    return int(text)


def parse_port(text: str) -> int:
    """A TCP port from 0 (any free one) to 65535 (an argparse type)."""
    if not text.isdigit() or not 0 <= int(text) <= 65_535:
        raise argparse.ArgumentTypeError(f"{text!r}: give a port from 0 to 65535")
    return int(text)


def parse_seconds(text: str) -> float:
    """A number of seconds above 0 (an argparse type)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return seconds


async def _after_time(store: EventStore, cutoff_ms: int) -> int:
    """The seq after which every event is at or after `cutoff_ms` (seqs are gap-free and
    timestamps follow them, so a binary search costs a few reads however long the log)."""
    low, high = 0, await store.last_seq()
    while low < high:
        mid = (low + high) // 2
        row = (await store.read_rows(mid, limit=1))[0]
        if row.ts >= cutoff_ms:
            high = mid
        else:
            low = mid + 1
    return low


Row = Event | UnreadableEvent
"""A listed row: an event, or a stored row whose data cannot be decoded."""


async def _events_after(store: EventStore, since: Since | None, kinds: list[str] | None,
                        key: str | None, limit: int) -> list[Row]:
    if since is None:
        top = await store.last_seq()
        # A tail: without filters the last `limit` seqs are the last `limit` events.
        after = max(top - limit, 0) if limit and kinds is None and key is None else 0
        rows = await store.read_rows(after, kinds=kinds, key=key)
        return rows[-limit:] if limit else rows
    if since.seq is not None:
        after = since.seq
    else:
        assert since.seconds is not None
        after = await _after_time(store, now_ms() - int(since.seconds * 1000))
    return await store.read_rows(after, kinds=kinds, key=key, limit=limit or None)


def _event_row(row: Row, now: int) -> list[str]:
    if isinstance(row, UnreadableEvent):
        data = f"UNREADABLE ({row.reason}): {UNREADABLE_HINT}"
    else:
        data = "" if row.data is None else to_json(row.data)
    return [str(row.seq), ago(row.ts, now), row.kind, clip(row.key, 40), row.origin,
            clip(data, 70 if isinstance(row, Event) else 200)]


def _row_json(row: Row) -> Any:
    if isinstance(row, UnreadableEvent):
        return {**msgspec.to_builtins(row), "unreadable": True}
    return msgspec.to_builtins(row)


UNREADABLE_HINT = "an engine opening this home quarantines it (docs/events.md)"
_EVENT_HEADERS = ("SEQ", "WHEN", "KIND", "KEY", "ORIGIN", "DATA")


def catalogued_kinds() -> set[str]:
    """Every kind in the catalogue of an engine built here: pulse_core's, and those of the
    survival layer and each installed layer (importing a layer registers its kinds)."""
    for group in ("pulse.survival", "pulse.layers"):
        for entry in entry_points(group=group):
            with contextlib.suppress(Exception):  # a broken layer is the daemon's to report
                entry.load()
    return set(known_kinds())


async def _check_kinds(store: EventStore, kinds: list[str], *, follow: bool) -> None:
    """UsageError naming the nearest known kind for a kind neither the catalogue nor the log
    knows (a kind only an engine's own code registers is known by its events); while
    following, only a warning: the first event of a new kind may be the one awaited."""
    unknown = [k for k in kinds if k not in known_kinds()]
    if unknown:
        catalogue = catalogued_kinds()
        unknown = [k for k in unknown if k not in catalogue
                   and not await store.read_rows(0, kinds=[k], limit=1)]
    if unknown:
        after = max(await store.last_seq() - KINDS_SUGGESTED_FROM, 0)
        logged = {row.kind for row in await store.read_rows(after)}
        problem = (f"no event kind {unknown[0]!r} in the catalogue or the log"
                   f"{did_you_mean(unknown[0], catalogue | logged)} (docs/events.md lists the "
                   "kinds)")
        if not follow:
            raise UsageError(problem)
        print(printable(f"upulse: warning: {problem}; following for it anyway"),
              file=sys.stderr, flush=True)


async def events(home: Home, *, kinds: list[str] | None, key: str | None, since: Since | None,
                 follow: bool, as_json: bool, limit: int, causes: bool = False) -> int:
    """Print events: the last `limit` (or, with `since`, the first `limit` after it); a row
    whose data cannot be decoded is listed as unreadable, never an error. With `causes`, each
    event with the tick that decided it and its cause chain (pulse_cli.drill). A kind
    neither the catalogue nor the log knows is a UsageError."""
    from pulse_cli.drill import cause_lines, event_causes, print_with_causes

    async with opened(home, read_only=True) as stores:
        store = stores.events

        async def as_json_row(row: Row) -> Any:
            found = _row_json(row)
            if causes and isinstance(row, Event):
                found.update(await event_causes(store, row))
            return found

        if kinds:
            await _check_kinds(store, kinds, follow=follow)
        listed = await _events_after(store, since, kinds, key, limit)
        now = now_ms()
        if as_json and not follow:
            print_json([await as_json_row(row) for row in listed])
            return 0
        if as_json:
            for row in listed:
                print_json_line(await as_json_row(row))
        elif causes:
            await print_with_causes(store, _EVENT_HEADERS, [
                (row if isinstance(row, Event) else None, _event_row(row, now))
                for row in listed], "" if follow else "no events")
        else:
            print_table(_EVENT_HEADERS, [_event_row(row, now) for row in listed],
                        "" if follow else "no events")
        if not follow:
            return 0
        cursor = listed[-1].seq if listed else (
            since.seq if since is not None and since.seq is not None else await store.last_seq())
        async for row in _follow(store, cursor, kinds):
            if key is not None and row.key != key:
                continue
            if as_json:
                print_json_line(await as_json_row(row))
            else:
                print(printable("  ".join(_event_row(row, now_ms()))), flush=True)
                if causes and isinstance(row, Event):
                    for line in cause_lines(await event_causes(store, row)):
                        print(line, flush=True)
    return 0


async def _follow(store: EventStore, cursor: int, kinds: list[str] | None
                  ) -> AsyncIterator[Row]:
    """Rows after `cursor` as they commit; an unreadable one comes as an UnreadableEvent."""
    while True:
        try:
            async for event in store.changes(cursor, kinds=kinds, poll_interval=0.25):
                cursor = event.seq
                yield event
        except EventUnreadable as exc:
            for row in await store.read_rows(exc.seq - 1, limit=1):
                yield row
            cursor = exc.seq


# -- effects -------------------------------------------------------------------------------


async def read_effects(store: EventStore) -> dict[str, EffectEntry]:
    """Every effect in the log, folded (pulse_core._effects.fold_effect), by id."""
    entries: dict[str, EffectEntry] = {}
    for event in await store.read(kinds=EFFECT_KINDS):
        entry = fold_effect(entries.get(event.key), event)
        if entry is not None:
            entries[event.key] = entry
    return entries


def effect_view(entry: EffectEntry) -> dict[str, Any]:
    """One effect as `upulse effects --json` prints it."""
    return {"id": entry.id, "type": entry.tag, "status": entry.status, "attempt": entry.attempt,
            "created_at": entry.created_at, "updated_at": entry.updated_at,
            "origin": entry.origin, "host": entry.host, "owner": entry.owner,
            "effect": entry.body, "error": entry.error, "result": entry.result}


async def effects(home: Home, *, pending: bool, failed: bool, as_json: bool, limit: int) -> int:
    """Print effects (all, or only unfinished, or only finally failed), newest last."""
    async with opened(home, read_only=True) as stores:
        entries = list((await read_effects(stores.events)).values())
    if pending:
        entries = [e for e in entries if not e.finished]
    if failed:
        entries = [e for e in entries if e.status is EffectStatus.FAILED]
    entries = entries[-limit:] if limit else entries
    if as_json:
        print_json([effect_view(e) for e in entries])
        return 0
    now = now_ms()
    rows = [[e.id, e.tag, e.status, e.attempt, ago(e.created_at, now), ago(e.updated_at, now),
             clip(e.error or ("" if e.result is None else to_json(e.result)), 60)]
            for e in entries]
    header = ["ID", "TYPE", "STATUS", "ATTEMPT", "CREATED", "UPDATED", "ERROR/RESULT"]
    if any(e.host for e in entries):  # engines of several hosts share the log
        header.insert(3, "RUNS ON")
        for row, entry in zip(rows, entries, strict=True):
            row.insert(3, entry.host or "any host")
    print_table(tuple(header), rows, "no effects")
    return 0


# -- tasks ---------------------------------------------------------------------------------


async def task_states(store: EventStore) -> dict[str, TaskState]:
    """Every task by id, folded from its lifecycle events."""
    found: dict[str, TaskState] = {}
    for event in await store.read(kinds=TASK_KINDS):
        with contextlib.suppress(InvalidTransition):
            state = next_task_state(found.get(event.key), event)
            if state is not None:
                found[event.key] = state
    return found


async def tasks(home: Home, *, as_json: bool, status: str | None) -> int:
    """Print every task with its current status, folded from its lifecycle events."""
    async with opened(home, read_only=True) as stores:
        found = await task_states(stores.events)
    listed = [t for t in found.values() if status is None or t.status == status]
    if as_json:
        print_json(listed)
        return 0
    now = now_ms()
    rows = [[t.id, t.status, t.priority, t.project, t.agent or "-", ago(t.created_at, now),
             clip(t.title, 50)] for t in listed]
    print_table(("ID", "STATUS", "PRIO", "PROJECT", "AGENT", "CREATED", "TITLE"), rows,
                "no tasks")
    return 0


async def task_command(home: Home, action: str, task_id: str, *, as_json: bool,
                       title: str = "", project: str = "default", prompt: str = "",
                       priority: int = 0, agent: str = "", result: str | None = None,
                       reason: str = "") -> int:
    """Append one task lifecycle event (checked against the task's status and version)."""
    parsed: Any = None
    if result is not None:
        try:
            parsed = json.loads(result)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--result must be JSON (like '{{\"ok\": true}}'): {exc}") from None
    async with opened(home, read_only=False) as stores:
        board = TaskBoard(stores.events, origin="cli")
        try:
            if action == "create":
                event = await board.create(task_id, title, project=project, prompt=prompt,
                                           priority=priority)
            elif action == "assign":
                event = await board.assign(task_id, agent)
            elif action == "start":
                event = await board.start(task_id)
            elif action == "ack":
                event = await board.ack(task_id, parsed)
            elif action == "close":
                event = await board.close(task_id)
            else:
                event = await board.give_up(task_id, reason)
        except VersionConflict:
            if action != "create":
                raise
            raise _exists(task_id, await board.state(task_id)) from None
        except InvalidTransition as exc:
            raise CliError(f"{exc} — {_LIFECYCLE}; `upulse tasks` shows each task's status"
                           ) from None
    if as_json:
        print_json(event)
    else:
        print(printable(f"task {task_id}: {event.kind} (event #{event.seq}, version "
                        f"{event.version})"))
    return 0


_LIFECYCLE = ("a task moves pending → assigned → executing → acked → closed, and can be "
              "given up until it is closed")


def _exists(task_id: str, task: TaskState | None) -> CliError:
    if task is None:
        return CliError(f"the key {task_id} already has events that are not a task's — pick "
                        "another id")
    return CliError(f"task {task_id} exists (status {task.status}) — use `upulse task "
                    f"assign|start|ack|close|give-up {task_id}` to move it, or pick another id")


# -- vitals --------------------------------------------------------------------------------


async def vitals(home: Home, key: str | None, *, since_s: float, as_json: bool,
                 limit: int) -> int:
    """Print the latest reading of every vitals key, or the recent samples of one key
    (UsageError naming the nearest key when the home has no such key)."""
    async with opened(home, read_only=True) as stores:
        latest = await stores.vitals.latest()
        if key is None:
            samples = sorted(latest.values(), key=lambda s: s.key)
        elif key not in latest:
            hint = did_you_mean(key, latest) or (
                " — `upulse vitals` lists the keys" if latest else
                " (no watcher has reported yet — is the daemon running?)")
            raise UsageError(f"no vitals key {key!r} in this home{hint}")
        else:
            samples = await stores.vitals.window(key, now_ms() - int(since_s * 1000))
            samples = samples[-limit:] if limit else samples
    if as_json:
        print_json(samples)
        return 0
    now = now_ms()
    rows = [[s.key, ago(s.ts, now), "ok" if s.ok else "error",
             clip(s.error if s.error else to_json(s.data), 80)] for s in samples]
    print_table(("KEY", "WHEN", "STATE", "DATA"), rows,
                "no samples" if key else "no vitals yet (is the daemon running?)")
    return 0
