"""daemon.log: what the daemon says, and why, as text for people or JSON lines for machines.

`DaemonLog` writes every line (config.json `daemon.log_format`: "text" or "json"); a line
repeated within REPEAT_WINDOW_S is counted and summarised once instead of written again.
`EventNarrator` follows the event log from where the daemon started (`EventStore.changes`:
each event read once, never a refold) and says one line, with its reason, for each restart
of an essential process (decided, and its outcome), failed start, give-up and recovery, each
rollback (decided, done, failed) and promote, each notification, and the outcome of each
business effect (any effect but the survival layer's: done, failed and retried, failed for
good). `LoopWatch` says when
one of the engine's supervised loops failed and restarts. The event names a JSON line
carries are listed in docs/cli.md ("daemon.log").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

import msgspec

from pulse_cli.config import LogFormat
from pulse_cli.directory_log import last_recorded
from pulse_cli.home import NOTICES_KEPT, Home, Notice
from pulse_cli.output import without_passwords
from pulse_core import (
    Event,
    EventStore,
    LoopStatus,
    PulseError,
    StoreClosed,
    StoreError,
    host_of,
    open_private,
)
from pulse_survival import SURVIVAL_TAGS

REPEAT_WINDOW_S = 30.0
"""A line said again within this many seconds of its first is counted, not written."""
HELD_MAX = 1_000
"""At most this many distinct lines are remembered for counting repeats."""
RETRY_S = 5.0
"""How long the narrator waits before reading the log again after the store failed."""
NARRATED_KINDS = ("effect", "effect-acked", "effect-failed", "mark", "notification",
                  "rollback", "promote", "process-requested")
NARRATED_EFFECTS = frozenset({"restart-process", "rollback", "notify"})
"""The effects whose decision or outcome gets a line (a notify's delivery is the
`notification` event; only its failure is said from the effect)."""
RESERVED = frozenset({"ts", "pid", "level", "event", "message"})
NOTICE_LEVELS = {"info": "info", "recovered": "info", "warning": "warning",
                 "error": "error", "critical": "error", "given-up": "error"}
"""A notification's level, as the level of its line (other levels: warning)."""


@dataclass
class _Held:
    """A line recently written: since when (time.monotonic), and how often said again."""

    since: float
    level: str
    fields: dict[str, Any]
    count: int = 0


def _encodable(value: Any) -> Any:
    return str(value)


_encoder = msgspec.json.Encoder(enc_hook=_encodable)


class DaemonLog:
    """Writes the daemon's lines to `stream` (default: the stdout of the moment, which is
    daemon.log once rotated onto fd 1) in `fmt`, counting quick repeats."""

    def __init__(self, fmt: LogFormat = "text", stream: TextIO | None = None, *,
                 window_s: float = REPEAT_WINDOW_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.format: LogFormat = fmt
        self.stream = stream
        self.window_s = window_s
        self._monotonic = monotonic
        self._held: dict[tuple[str, str], _Held] = {}

    def say(self, message: str, *, event: str = "daemon", level: str = "info",
            **fields: Any) -> None:
        """One line: `message` for people, `event` (a short machine name such as
        "process-restart") and `fields` for machines. The same event and message again
        within `window_s` is only counted; `flush` writes how often."""
        clash = RESERVED & fields.keys()
        if clash:
            raise ValueError(f"log fields {sorted(clash)} are reserved: rename them")
        now = self._monotonic()
        key = (event, message)
        held = self._held.get(key)
        if held is not None and now - held.since < self.window_s:
            held.count += 1
            return
        if held is not None:
            self._summarise(key, self._held.pop(key))
        if len(self._held) >= HELD_MAX:
            oldest = next(iter(self._held))
            self._summarise(oldest, self._held.pop(oldest))
        self._held[key] = _Held(now, level, fields)
        self._write(level, event, message, fields)

    def flush(self, *, everything: bool = False) -> None:
        """Write the count of each line repeated since it was written, once its window has
        passed (the daemon calls this every second), or at once with `everything` (when
        the daemon stops)."""
        now = self._monotonic()
        for key in [k for k, h in self._held.items()
                    if everything or now - h.since >= self.window_s]:
            self._summarise(key, self._held.pop(key))

    def _summarise(self, key: tuple[str, str], held: _Held) -> None:
        if held.count:
            event, message = key
            self._write(held.level, event, f"{message} (said {held.count} more time(s) within "
                        f"{self.window_s:g} s)", {**held.fields, "repeated": held.count})

    def _write(self, level: str, event: str, message: str, fields: dict[str, Any]) -> None:
        message = without_passwords(message)
        if self.format == "json":
            stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            line = _encoder.encode({"ts": stamp, "pid": os.getpid(), "level": level,
                                    "event": event, "message": message, **fields}).decode()
        else:
            line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} upulse[{os.getpid()}]: {message}"
        out = self.stream or sys.stdout
        out.write(line + "\n")
        out.flush()


class LogRecords(logging.Handler):
    """Hands the `pulse` logger's records (warnings of the engine and the stores) to a
    DaemonLog, so they take its format too (event "pulse-log")."""

    def __init__(self, log: DaemonLog) -> None:
        super().__init__(logging.WARNING)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.log.say(record.getMessage(), event="pulse-log",
                         level=record.levelname.lower(), logger=record.name)
        except Exception:
            self.handleError(record)


def _text(data: Any, name: str, default: str = "") -> str:
    value = data.get(name) if isinstance(data, dict) else None
    return default if value is None else str(value)


def _short(revision: str) -> str:
    return revision[:12] if revision else "?"


class EventNarrator:
    """Follows the event log after `after_seq` and says a line for each event that matters
    to an operator (see the module's docstring); keeps the last NOTICES_KEPT notices.

    `host` is the engine's placement: on a log several hosts share, effects, marks and
    engine-directory events another host recorded are not this daemon's to tell.
    """

    def __init__(self, log: DaemonLog, after_seq: int, host: str = "") -> None:
        self.log = log
        self.after_seq = after_seq
        self.host = host
        self.notices: deque[Notice] = deque(maxlen=NOTICES_KEPT)
        self._effects: dict[str, dict[str, Any]] = {}  # narrated effects not yet finished
        self._started: dict[str, tuple[Any, int]] = {}  # process: its last restart's pid, ts

    async def seed_notices(self, events: EventStore) -> None:
        """Keep the last notices recorded before `after_seq` (what `daemon status` shows
        right after a start)."""
        found = await events.read(kinds=["notification"], limit=NOTICES_KEPT,
                                  newest_first=True)
        for event in reversed([e for e in found if e.seq <= self.after_seq]):
            self.notices.append(_notice(event))

    async def follow(self, events: EventStore) -> None:
        """Narrate every new event of `events` until cancelled or the store closes; a read
        that fails is tried again after RETRY_S, from where the narration stopped."""
        while True:
            try:
                async for event in events.changes(self.after_seq, kinds=NARRATED_KINDS):
                    self.after_seq = event.seq
                    try:
                        self.narrate(event)
                    except Exception as exc:  # one odd event must not end the narration
                        self.log.say(f"cannot narrate event #{event.seq} ({event.kind}): "
                                     f"{type(exc).__name__}: {exc}", event="narrate-failed",
                                     level="error", seq=event.seq)
            except StoreClosed:
                return
            except PulseError as exc:  # the store is down, say
                self.log.say(f"cannot read the event log to narrate it, trying again in "
                             f"{RETRY_S:g} s: {exc}", event="log-unreadable", level="error")
                await asyncio.sleep(RETRY_S)

    def narrate(self, event: Event) -> None:
        """Say the line `event` calls for, if any."""
        if host_of(event) not in ("", self.host):
            return
        data = event.data if isinstance(event.data, dict) else {}
        if event.kind == "effect":
            self._decided(event, data)
        elif event.kind in ("effect-acked", "effect-failed"):
            self._outcome(event, data)
        elif event.kind == "mark":
            self._mark(data.get("mark"))
        elif event.kind == "notification":
            notice = _notice(event)
            self.notices.append(notice)
            self.log.say(f"notice {notice.topic} [{notice.level}]: {notice.text}",
                         event="notify", level=NOTICE_LEVELS.get(notice.level, "warning"),
                         topic=notice.topic, notice_level=notice.level, text=notice.text)
        elif event.kind == "rollback":
            to, revision = _text(data, "to"), _text(data, "revision")
            moved = "" if to == revision else f" (main now at {_short(revision)})"
            kept = _text(data, "kept")
            self.log.say(f"rolled back to {_short(to)}{moved}, by {event.origin}: "
                         f"{_text(data, 'reason', 'no reason given')}"
                         + (f"; the code taken out is on branch {kept}" if kept else ""),
                         event="rollback", level="warning", to=to, revision=revision,
                         reason=_text(data, "reason"), origin=event.origin, kept=kept or None)
        elif event.kind == "process-requested":  # an operator's word (pulse_survival.control)
            action, name = _text(data, "action"), _text(data, "name")
            self.log.say(f"{action} {name} asked by {event.origin}: "
                         f"{_text(data, 'reason', 'no reason given')}", event="process-request",
                         level="warning", process=name, action=action, origin=event.origin)
        elif event.kind == "promote":
            revision, previous = _text(data, "revision"), _text(data, "previous")
            self.log.say(f"promoted {_short(revision)} (main was at {_short(previous)}), by "
                         f"{event.origin}", event="promote", revision=revision,
                         previous=previous, origin=event.origin)

    def _decided(self, event: Event, data: dict[str, Any]) -> None:
        effect = data.get("effect")
        kind = effect.get("type") if isinstance(effect, dict) else None
        if not isinstance(effect, dict) or not isinstance(kind, str) or \
                kind in SURVIVAL_TAGS - NARRATED_EFFECTS:  # housekeeping: no line
            return
        if len(self._effects) >= HELD_MAX:  # outcomes never seen (another engine ran them)
            self._effects.pop(next(iter(self._effects)))
        # a business effect's body may be large: its type is all its outcome line needs
        self._effects[event.key] = effect if kind in NARRATED_EFFECTS else {"type": kind}
        if kind == "restart-process":
            name = _text(effect, "name")
            pid, at = self._started.pop(name, (None, 0))
            gone = "" if pid is None else \
                f" (pid {pid}, started {(event.ts - at) / 1000:.0f} s before, is gone)"
            self.log.say(f"restarting {name}: {_text(effect, 'reason', 'no reason given')}"
                         f"{gone}", event="process-restart", level="warning", process=name,
                         reason=_text(effect, "reason"), effect=event.key, gone_pid=pid)
        elif kind == "rollback":
            target = _text(effect, "revision") or "the revision before the last promote"
            who = "the survival layer" if event.origin.startswith("engine") else event.origin
            urgent = " (emergency)" if effect.get("emergency") else ""
            self.log.say(f"rollback decided by {who}{urgent}, to {target}: "
                         f"{_text(effect, 'reason', 'no reason given')}",
                         event="rollback-decided", level="warning", target=target,
                         reason=_text(effect, "reason"), origin=event.origin,
                         effect=event.key)

    def _outcome(self, event: Event, data: dict[str, Any]) -> None:
        effect = self._effects.get(event.key)
        if effect is None:
            return
        kind, attempt = effect.get("type"), data.get("attempt")
        acked = event.kind == "effect-acked"
        final = acked or bool(data.get("final"))
        if final:
            del self._effects[event.key]
        error = _text(data, "error")
        retry = "for good" if final else "it is retried"
        fields: dict[str, Any] = {"effect": event.key, "attempt": attempt}
        if kind == "restart-process":
            name = _text(effect, "name")
            if acked:
                result = data.get("result")
                pid = result.get("pid") if isinstance(result, dict) else None
                self._started[name] = (pid, event.ts)
                self.log.say(f"restarted {name}: pid {pid}", event="process-restarted",
                             process=name, process_pid=pid, **fields)
            else:
                self.log.say(f"restart of {name} failed ({retry}): {error}",
                             event="process-restart-failed", level="error", process=name,
                             error=error, final=final, **fields)
        elif kind not in SURVIVAL_TAGS:  # a business effect: the outcome is its line
            level = "info" if acked else "error" if final else "warning"
            said = "done" if acked else f"failed ({retry}): {error}"
            self.log.say(f"effect {kind} {event.key} {said}", event="effect-outcome",
                         level=level, type=kind, acked=acked, error=error or None,
                         final=final, **fields)
        elif kind == "rollback" and not acked:
            self.log.say(f"rollback failed ({retry}): {error}", event="rollback-failed",
                         level="error", error=error, final=final, **fields)
        elif kind == "notify" and not acked:
            topic = _text(effect, "topic")
            self.log.say(f"notice {topic} [{_text(effect, 'level')}] was not delivered "
                         f"({retry}): {error}", event="notify-failed", level="error",
                         topic=topic, error=error, final=final, **fields)

    def _mark(self, mark: Any) -> None:
        tag, name = _text(mark, "type"), _text(mark, "name")
        if tag == "process-start-failed":
            self.log.say(f"{name} died again before it stayed up startsecs after its restart "
                         "(a failed start)", event="process-start-failed", level="warning",
                         process=name)
        elif tag == "process-gave-up":
            why = _text(mark, "why")
            self.log.say(f"gave up restarting {name}: {why}", event="process-given-up",
                         level="error", process=name, why=why)
        elif tag == "process-recovered":
            pid = mark.get("pid") if isinstance(mark, dict) else None
            self.log.say(f"{name} is alive again (pid {pid}): it is restarted again when it "
                         "dies", event="process-recovered", process=name, process_pid=pid)


def _notice(event: Event) -> Notice:
    data = event.data
    return Notice(event.ts, _text(data, "topic", event.key), _text(data, "level"),
                  _text(data, "text"))


class LoopWatch:
    """Says a line each time one of the engine's supervised loops failed (its restart count
    rose since the last look); `reset` for a new engine, whose counts start again."""

    def __init__(self, log: DaemonLog) -> None:
        self.log = log
        self._restarts: dict[str, int] = {}

    def reset(self) -> None:
        self._restarts = {}

    def look(self, loops: list[LoopStatus]) -> None:
        """Compare `loops` (engine.loops()) with the last look."""
        for loop in loops:
            before = self._restarts.get(loop.name, 0)
            self._restarts[loop.name] = loop.restarts
            if loop.restarts > before:
                self.log.say(f"engine loop {loop.name} failed and restarts after a backoff: "
                             f"{loop.last_error}", event="loop-restart", level="error",
                             loop=loop.name, restarts=loop.restarts, state=loop.state.value,
                             last_error=loop.last_error)


async def reload_cause(events: EventStore, host: str, after_seq: int) -> str | None:
    """The promote or rollback of `host`'s engine directory recorded after `after_seq`, as
    the reason of the reload it asked for ("rollback to 9c1e2f0a7b6d by cli: why"); None
    when none was (or the log cannot say)."""
    last: Event | None = None
    with contextlib.suppress(StoreError):
        last = await last_recorded(events, host, ["promote", "rollback"])
    if last is None or last.seq <= after_seq:
        return None
    if last.kind == "promote":
        return f"promote of {_short(_text(last.data, 'revision'))} by {last.origin}"
    return (f"rollback to {_short(_text(last.data, 'to'))} by {last.origin}: "
            f"{_text(last.data, 'reason', 'no reason given')}")


def rotate_log(home: Home, max_bytes: int, log: DaemonLog) -> None:
    """Move daemon.log to daemon.log.1 once it passes `max_bytes`, if it is our stdout."""
    try:
        ours = os.fstat(1).st_ino == home.logfile.stat().st_ino
        too_big = home.logfile.stat().st_size > max_bytes
    except OSError:
        return
    if not (ours and too_big):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.replace(home.logfile, home.logfile.with_name("daemon.log.1"))
    fd = open_private(home.logfile, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    log.say(f"log rotated (previous part: {home.logfile.name}.1)", event="log-rotated")
