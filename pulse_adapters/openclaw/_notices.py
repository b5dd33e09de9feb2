"""Notices for the agent's model: chosen effects, each read by the model once.

The service follows the log's `effect` events from a durable cursor (the newest settled
notice's `through`, the seq below which every chosen effect is settled, or where the service
first started). Each effect whose tag is chosen is queued as a system event of the session
with the Gateway RPC `system-event` (through `openclaw gateway call`), its text starting
`[pulse:<effect id>]`, and recorded as `openclaw-notice-queued` with the gateway's pid.
OpenClaw prepends the queued system events to the session's next model request and drops
them from the queue. The queue lives in the gateway's memory and holds at most 20 events per
session (the oldest is dropped past that): the service keeps at most `max_queued` notices
there at once, and queues none while the gateway's queue is full.

Every `poll_s`, and when the session's transcript gains a turn, the service asks the
gateway (`status`: its `queuedSystemEvents` and `pid`) whether each queued notice is still
there; one status call serves every notice that needs none newer. One that left the queue of
the same gateway process was consumed by a turn: `openclaw-notice-delivered` is recorded at key
`openclaw-notice:<effect id>` with expected version 0. One whose gateway restarted meanwhile
was lost with its queue, unless the session's transcript gained a turn since it was queued
(that turn read it): it is queued again. A notice still in the queue is never queued twice,
and each attempt is claimed in the log first (a lease renewed while the notice waits for a
turn), so two engines on one log never deliver the same notice twice. With `show_in_ui` the
notice is also appended to the transcript with `chat.inject` (once, found by its label), for
a human in the UI only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from pulse_adapters.agents import ProgramCheck, notice_body, open_notice
from pulse_adapters.openclaw._claims import ORIGIN, NoticeClaims, attempt_key
from pulse_adapters.openclaw._cli import OpenClawCli, OpenClawCommandFailed
from pulse_adapters.openclaw._kinds import (
    NOTICE_DELIVERED,
    NOTICE_FAILED,
    NOTICE_QUEUED,
    NoticeDelivered,
    NoticeFailed,
    NoticeQueued,
    notice_key,
    notice_label,
)
from pulse_adapters.openclaw._settings import OpenClawSettings
from pulse_adapters.openclaw._store import AgentStore
from pulse_core import (
    Backoff,
    Event,
    EventDraft,
    EventStore,
    VersionConflict,
    redact_urls,
    register_kind,
)

if TYPE_CHECKING:
    from pulse_core import Engine

log = logging.getLogger("pulse.openclaw")

STARTED = "openclaw-notices-started"
STARTED_KEY = "openclaw-notices"
CLAIM_POLL_S = 0.5
RELEASE_S = 2.0  # how long a stopping service may take to release its claims
TURN_POLL_S = 0.5  # how often the session's transcript is read for a new turn
TURN_ROW_S = 5.0
"""How long a notice gone from the queue right after it was queued waits for the turn that
took it to show in the transcript (a turn drains the queue as it builds its prompt, and its
rows are written after)."""
GATEWAY_QUEUE_MAX = 20  # OpenClaw keeps this many system events per session, dropping the oldest

register_kind(STARTED, "the openclaw notice service's first start; data: seq (notices of "
                       "effects after it are delivered); key: openclaw-notices, written once")


class NoticeNotListed(RuntimeError):
    """The gateway took a notice's system event, but its status does not list it: the
    session is not one whose queue the gateway reports (its agents' main sessions)."""


@dataclass(frozen=True)
class QueueState:
    """What the gateway's status says of one notice: its process, whether the notice is
    queued, whether the queue is full (one more would push the oldest out), and when
    (`time.monotonic()`) the status call that said so began."""

    pid: int | None
    held: bool
    full: bool
    asked_at: float


def notice_text(effect: dict[str, Any]) -> str:
    """What the agent reads: `[pulse] ` and the notice text every host shows
    (`pulse_adapters.agents.notice_body`: a notify's level, topic and text with its quoted
    texts fenced as data; another effect's tag and fields, never its `env`; URLs cut)."""
    return f"[pulse] {notice_body(effect)}"


class NoticeDelivery:
    """The layer's service `openclaw-notices` (see the module docstring). A failed attempt (the
    gateway down, a call refused) is recorded as `openclaw-notice-failed` and retried with
    backoff, in order, forever: the notice stays pending, never lost, never queued twice."""

    name = "openclaw-notices"

    def __init__(self, settings: OpenClawSettings, cli: OpenClawCli, store: AgentStore,
                 program: ProgramCheck) -> None:
        self.settings = settings
        self.cli = cli
        self.store = store
        self.program = program
        notices = settings.notices
        self.effects = frozenset(notices.effects)
        self.session_key = settings.notice_session()
        # a claim stands twice a gateway call's own limit unless renewed
        self.claims = NoticeClaims(lease_s=2 * (notices.timeout_s + 15))
        self.backoff = Backoff(initial_ms=int(notices.retry_initial_s * 1000), factor=2.0,
                               max_ms=int(notices.retry_max_s * 1000))
        self.open: set[int] = set()  # seqs of chosen effects being settled
        self.seen = 0  # the newest effect seq followed
        self.pushed_out: set[str] = set()  # effect ids the gateway's full queue dropped
        # what this service queued, by effect id, until the delivery is recorded: a record
        # the store did not take (an outage) is not taken for a notice never queued
        self.queued: dict[str, NoticeQueued] = {}
        # the newest gateway status call (when it began, what it said or how it failed),
        # shared by the notices being settled (queue_state)
        self._last_status: tuple[float, Any] | None = None
        self._asking = asyncio.Lock()

    async def cursor(self, events: EventStore) -> int:
        """The seq after which effects are still to be settled (first start: the engine's
        `engine-started`, recorded)."""
        delivered = await events.read(kinds=[NOTICE_DELIVERED], newest_first=True, limit=1)
        started = await events.read(key=STARTED_KEY, limit=1)
        if not started:  # from this engine's start: an effect appended since is not skipped
            opened = await events.read(kinds=["engine-started"], newest_first=True, limit=1)
            head = opened[0].seq if opened else await events.last_seq()
            try:
                result = await events.append(
                    [EventDraft(STARTED, STARTED_KEY, {"seq": head}, origin=ORIGIN)],
                    expect={STARTED_KEY: 0})
                started = list(result.events)
            except VersionConflict:
                started = await events.read(key=STARTED_KEY, limit=1)
        seqs = [int(e.data.get("through") or e.data["seq"]) for e in delivered]
        seqs += [int(e.data["seq"]) for e in started]
        return max(seqs, default=0)

    async def __call__(self, engine: Engine) -> None:
        events = engine.events
        cursor = await self.cursor(events)
        self.seen = cursor
        slots = asyncio.Semaphore(self.settings.notices.max_queued)
        async with asyncio.TaskGroup() as settling:
            async for event in events.changes(cursor, kinds=["effect"]):
                body = event.data.get("effect") if isinstance(event.data, dict) else None
                if isinstance(body, dict) and body.get("type") in self.effects:
                    self.open.add(event.seq)  # before the wait: `through` stays below it
                    await slots.acquire()
                    settling.create_task(self._settle_in(slots, events, event, body))
                self.seen = event.seq

    async def _settle_in(self, slots: asyncio.Semaphore, events: EventStore, event: Event,
                         body: dict[str, Any]) -> None:
        try:
            await self.settle(events, event, body)
        except asyncio.CancelledError:  # the engine stops: the next one need not wait
            with contextlib.suppress(Exception):  # out this one's lease
                async with asyncio.timeout(RELEASE_S):
                    await self.claims.release(events, event.key)
            raise
        finally:
            self.open.discard(event.seq)
            slots.release()

    def through(self, seq: int) -> int:
        """The seq up to which every chosen effect is settled once effect #`seq` is."""
        others = self.open - {seq}
        return min(others) - 1 if others else max(self.seen, seq)

    async def settle(self, events: EventStore, event: Event, effect: dict[str, Any]) -> None:
        """Deliver the effect of `event` unless it already was; retry until it is. Each
        attempt is claimed first (`openclaw-notice-claimed` at the attempt key, with that key's
        expected version), so engines sharing the log never deliver one notice at once."""
        effect_id, key = event.key, notice_key(event.key)
        attempt = 0
        while await events.head(key) == 0:
            if not await self.claims.claim(events, effect_id, event.seq):
                await asyncio.sleep(CLAIM_POLL_S)  # another engine delivers it now
                continue
            try:  # sealed memory text the notice quotes is opened only to be shown
                shown = await asyncio.to_thread(open_notice, effect, events.keys)
                outcome = await self.deliver(events, event, effect_id, shown)
            except Exception as exc:
                attempt += 1
                delay = self.backoff.delay_ms(attempt)
                error = redact_urls(f"{type(exc).__name__}: {exc}")[:500]
                log.warning("pulse: openclaw notice %s failed (attempt %d, again in %d ms): %s",
                            effect_id, attempt, delay, error)
                await events.append([EventDraft(
                    NOTICE_FAILED, attempt_key(effect_id),
                    NoticeFailed(effect_id=effect_id, attempt=attempt, error=error,
                                 retry_in_ms=delay), origin=ORIGIN, cause=event.seq)])
                await asyncio.sleep(delay / 1000)
                continue
            if outcome is None:
                continue  # lost with a restarted gateway, or its claim taken: again
            attempt = 0
            record = NoticeDelivered(effect_id=effect_id, seq=event.seq,
                                     tag=str(effect.get("type")), session_key=self.session_key,
                                     recovered=outcome, through=self.through(event.seq))
            with contextlib.suppress(VersionConflict):  # another engine recorded it first
                await events.append([EventDraft(NOTICE_DELIVERED, key, record, origin=ORIGIN,
                                                cause=event.seq)], expect={key: 0})
            break
        self.queued.pop(effect_id, None)  # its delivery is recorded (here or by another)

    async def deliver(self, events: EventStore, event: Event, effect_id: str,
                      effect: dict[str, Any]) -> bool | None:
        """Queue the notice unless the gateway holds it already, then wait until a turn
        consumed it: False, or True when that is known from a turn in the transcript after
        its gateway restarted. None when it is to be queued again (the gateway that held it
        restarted before a turn, or the gateway's full queue dropped it) or another engine
        took the claim over."""
        label = notice_label(effect_id)
        where = attempt_key(effect_id)
        notices = self.settings.notices
        # the claim was just taken: a status begun since shows every earlier queueing of the
        # notice (this engine's attempts before, another's before its claim)
        entered = time.monotonic()
        await self.program.require()
        state = await self.queue_state(label, since=entered)
        turns = await self._turns()
        pushed_out = effect_id in self.pushed_out
        self.pushed_out.discard(effect_id)
        if not state.held and not pushed_out and (
                before := self.queued.get(effect_id) or await self._queued_before(events, where)):
            if before.gateway_pid == state.pid:  # an engine queued it; a turn has read it
                return False
            if before.turns is not None and turns > before.turns:
                return True  # its gateway restarted, after a turn that read it
        while not state.held and state.full:  # queued now, it could push one out
            await asyncio.sleep(notices.poll_s)
            if not await self.claims.renew(events, effect_id, event.seq):
                return None
            state = await self.queue_state(label, since=time.monotonic())
            turns = await self._turns()
        if not state.held:
            # the status calls before may have waited their turn behind others: the claim
            # is renewed (or found taken over) before the notice is queued
            if not await self.claims.renew(events, effect_id, event.seq):
                return None
            text = f"[{label}] {notice_text(effect)}"
            await self.cli.call("system-event", {"sessionKey": self.session_key, "text": text},
                                timeout_s=notices.timeout_s)
            state = await self.queue_state(label, since=time.monotonic())
            queued = NoticeQueued(effect_id=effect_id, session_key=self.session_key,
                                  gateway_pid=state.pid, turns=turns)
            if not state.held:
                if await self._turn_after(turns):
                    self.queued[effect_id] = queued
                    return False  # a turn began meanwhile and read it
                if state.pid is not None and not state.full:
                    raise NoticeNotListed(
                        f"the gateway took the system event for {self.session_key!r} but its "
                        "status does not list it: notices need an agent's main session as "
                        "notices.session_key")
                return None  # restarted between the two calls, or pushed out: again
            self.queued[effect_id] = queued
            await events.append([EventDraft(NOTICE_QUEUED, where, queued, origin=ORIGIN,
                                            cause=event.seq)])
            if notices.show_in_ui:
                await self.show(effect_id, effect)
                turns = await self._turns()
        return await self._wait_for_turn(events, event.seq, effect_id, state.pid, turns)

    async def _wait_for_turn(self, events: EventStore, cause: int, effect_id: str,
                             pid: int | None, turns: int) -> bool | None:
        """`deliver`'s outcome for a notice queued in gateway process `pid` when the
        session's transcript counted `turns`, once a turn took it or that process is gone
        (the claim renewed meanwhile)."""
        label, poll_s = notice_label(effect_id), self.settings.notices.poll_s
        renewed = asked = time.monotonic()
        seen = turns
        while True:
            await asyncio.sleep(min(TURN_POLL_S, poll_s))
            if time.monotonic() - renewed > self.claims.lease_s / 3:
                if not await self.claims.renew(events, effect_id, cause):
                    return None
                renewed = time.monotonic()
            now_turns = await self._turns()
            looked = time.monotonic()
            if now_turns == seen and looked - asked < poll_s:
                continue  # no turn yet: the gateway is asked only every poll_s
            # any status begun since this notice's last one (since the turn was seen) is
            # news to it: one asked for another waiting notice serves this one too
            now = await self.queue_state(label, since=asked if now_turns == seen else looked)
            seen, asked = now_turns, now.asked_at
            if now.pid != pid:  # another gateway process: its queue began empty
                return True if now_turns > turns else None
            if not now.held:
                if now.full:  # pushed out by newer events, unread: queued again
                    self.pushed_out.add(effect_id)
                    return None
                return False

    async def _turns(self) -> int:
        """The session transcript's growing count (AgentStore.turns), read off the loop."""
        return await asyncio.to_thread(self.store.turns, self.session_key)

    async def _turn_after(self, turns: int) -> bool:
        """Whether the transcript shows a turn after `turns` within TURN_ROW_S."""
        deadline = time.monotonic() + TURN_ROW_S
        while await self._turns() <= turns:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(TURN_POLL_S)
        return True

    async def _queued_before(self, events: EventStore, where: str) -> NoticeQueued | None:
        """The newest record of this notice being queued (by any engine), if any."""
        found = await events.read(key=where, kinds=[NOTICE_QUEUED], newest_first=True, limit=1)
        if not found:
            return None
        try:
            return msgspec.convert(found[0].data, NoticeQueued)
        except msgspec.ValidationError:
            return None

    async def queue_state(self, label: str, since: float) -> QueueState:
        """The gateway's pid, whether a system event labelled `label` is queued, and whether
        its queue is full, from a `status` call begun after `since` (a `time.monotonic()`
        moment), shared with the other notices being settled."""
        asked_at, status = await self._status(since)
        if not isinstance(status, dict):
            raise TypeError(f"gateway status is not an object: {str(status)[:200]}")
        pid = status.get("pid")
        texts = [t for t in status.get("queuedSystemEvents") or [] if isinstance(t, str)]
        return QueueState(pid=pid if isinstance(pid, int) else None,
                          held=any(f"[{label}]" in t for t in texts),
                          full=len(texts) >= GATEWAY_QUEUE_MAX, asked_at=asked_at)

    async def _status(self, since: float) -> tuple[float, Any]:
        """When a `status` call begun after `since` began, and what it returned (or its
        failure, raised): the newest one, or a new one."""
        # Each `openclaw gateway call` is a Node process of seconds of CPU: the notices take
        # turns asking, and one answer (or failure) serves every notice that needs none newer.
        async with self._asking:
            last = self._last_status
            if last is None or last[0] <= since:
                asked_at = time.monotonic()
                try:
                    status = await self.cli.call("status", {},
                                                 timeout_s=self.settings.notices.timeout_s)
                except OpenClawCommandFailed as exc:
                    self._last_status = (asked_at, exc)
                    raise
                last = self._last_status = (asked_at, status)
        if isinstance(last[1], OpenClawCommandFailed):
            raise OpenClawCommandFailed(str(last[1]))
        return last

    async def show(self, effect_id: str, effect: dict[str, Any]) -> None:
        """Append the notice to the transcript for the UI (`chat.inject`), unless there."""
        label = notice_label(effect_id)
        if await asyncio.to_thread(self.store.find_text, self.session_key, f"[{label}]"):
            return
        await self.cli.call(
            "chat.inject", {"sessionKey": self.session_key, "message": notice_text(effect),
                            "label": label}, timeout_s=self.settings.notices.timeout_s)
