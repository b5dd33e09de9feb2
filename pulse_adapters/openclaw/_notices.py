"""Notices into the agent's session: chosen effects, each delivered once through OpenClaw.

The service follows the log's `effect` events from a durable cursor (the seq of the last
settled notice, or where the service first started). Each effect whose tag is chosen is
appended to the session's transcript with the Gateway RPC `chat.inject` (through
`openclaw gateway call`), labelled `pulse:<effect id>`, and recorded as
`openclaw-notice-delivered` at key `openclaw-notice:<effect id>` with expected version 0.
`chat.inject` takes no idempotency key, so before each delivery the transcript is searched for
the label: a delivery that landed before a crash is recorded, never repeated. Each attempt is
claimed in the log first, so two engines on one log never deliver the same notice at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING, Any

from pulse_adapters.agents import ProgramCheck, notice_body, open_notice
from pulse_adapters.openclaw._cli import OpenClawCli
from pulse_adapters.openclaw._kinds import (
    NOTICE_DELIVERED,
    NOTICE_FAILED,
    NoticeDelivered,
    NoticeFailed,
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
    process_started,
    redact_urls,
    register_kind,
)

if TYPE_CHECKING:
    from pulse_core import Engine

log = logging.getLogger("pulse.openclaw")

STARTED = "openclaw-notices-started"
STARTED_KEY = "openclaw-notices"
ORIGIN = "executor:openclaw-notices"

CLAIMED = "openclaw-notice-claimed"
CLAIM_POLL_S = 0.5

register_kind(STARTED, "the openclaw notice service's first start; data: seq (notices of "
                       "effects after it are delivered); key: openclaw-notices, written once")
register_kind(CLAIMED, "an engine attempts a notice's delivery; key: "
                       "openclaw-notice-attempt:<effect id>; data: owner, host, pid, started, "
                       "until_ms (the claim's lease)")


def attempt_key(effect_id: str) -> str:
    """The key of an effect's delivery attempts: claims and failures."""
    return f"openclaw-notice-attempt:{effect_id}"


def notice_text(effect: dict[str, Any]) -> str:
    """What the agent reads: `[pulse] ` and the notice text every host shows
    (`pulse_adapters.agents.notice_body`: a notify's level, topic and text with its quoted
    texts fenced as data; another effect's tag and fields, never its `env`; URLs cut)."""
    return f"[pulse] {notice_body(effect)}"


class NoticeDelivery:
    """The layer's service `openclaw-notices` (see the module docstring). A failed delivery is
    recorded as `openclaw-notice-failed` and retried with backoff, in order, forever."""

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
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.host = socket.gethostname()
        self.backoff = Backoff(initial_ms=int(notices.retry_initial_s * 1000), factor=2.0,
                               max_ms=int(notices.retry_max_s * 1000))

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
        seqs = [int(e.data["seq"]) for e in (*delivered, *started)]
        return max(seqs, default=0)

    async def __call__(self, engine: Engine) -> None:
        events = engine.events
        async for event in events.changes(await self.cursor(events), kinds=["effect"]):
            body = event.data.get("effect") if isinstance(event.data, dict) else None
            if isinstance(body, dict) and body.get("type") in self.effects:
                await self.settle(events, event, body)

    async def settle(self, events: EventStore, event: Event, effect: dict[str, Any]) -> None:
        """Deliver the effect of `event` unless it already was; retry until it is. Each
        attempt is claimed first (`openclaw-notice-claimed` at the attempt key, with that key's
        expected version), so engines sharing the log never deliver one notice at once."""
        effect_id, key = event.key, notice_key(event.key)
        attempt = 0
        while await events.head(key) == 0:
            if not await self.claim(events, effect_id, event.seq):
                await asyncio.sleep(CLAIM_POLL_S)  # another engine delivers it now
                continue
            try:  # sealed memory text the notice quotes is opened only to be shown
                shown = await asyncio.to_thread(open_notice, effect, events.keys)
                message_id, recovered = await self.deliver(effect_id, shown)
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
            record = NoticeDelivered(effect_id=effect_id, seq=event.seq,
                                     tag=str(effect.get("type")), session_key=self.session_key,
                                     message_id=message_id, recovered=recovered)
            with contextlib.suppress(VersionConflict):  # another engine recorded it first
                await events.append([EventDraft(NOTICE_DELIVERED, key, record, origin=ORIGIN,
                                                cause=event.seq)], expect={key: 0})
            return

    async def claim(self, events: EventStore, effect_id: str, cause: int) -> bool:
        """Whether this service may attempt the delivery now: no live claim of another
        engine stands (one ends with its lease, or at once when its process on this host is
        gone), and this one's claim was appended first."""
        where = attempt_key(effect_id)
        last = await events.read(key=where, newest_first=True, limit=1)
        if last and last[0].kind == CLAIMED and self._held_elsewhere(last[0].data):
            return False
        lease_s = 2 * (self.settings.notices.timeout_s + 15)  # the CLI call's own limit, twice
        claim = {"effect_id": effect_id, "owner": self.owner, "host": self.host,
                 "pid": os.getpid(), "started": process_started(os.getpid()),
                 "until_ms": int((time.time() + lease_s) * 1000)}
        try:
            await events.append([EventDraft(CLAIMED, where, claim, origin=ORIGIN, cause=cause)],
                                expect={where: last[0].version if last else 0})
        except VersionConflict:
            return False
        return True

    def _held_elsewhere(self, claim: Any) -> bool:
        if not isinstance(claim, dict) or claim.get("owner") == self.owner:
            return False
        if claim.get("host") == self.host and process_started(int(claim.get("pid", 0))) != \
                claim.get("started"):
            return False  # its process on this host is gone (or the pid is another's now)
        return bool(int(claim.get("until_ms", 0)) > time.time() * 1000)

    async def deliver(self, effect_id: str, effect: dict[str, Any]) -> tuple[str | None, bool]:
        """(message id, recovered): the notice appended to the session now, or found there
        from a delivery the record of which was lost."""
        label = notice_label(effect_id)
        if await asyncio.to_thread(self.store.find_text, self.session_key, f"[{label}]"):
            return None, True
        await self.program.require()
        result = await self.cli.call(
            "chat.inject", {"sessionKey": self.session_key, "message": notice_text(effect),
                            "label": label}, timeout_s=self.settings.notices.timeout_s)
        message_id = result.get("messageId") if isinstance(result, dict) else None
        return (message_id if isinstance(message_id, str) else None), False
