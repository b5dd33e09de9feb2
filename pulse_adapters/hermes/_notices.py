"""Notices for the agent: `effect` events of the notice tags (default `notify`, the survival
layer's Notify) not yet offered to a Hermes turn, each offered exactly once.

A notice is claimed by appending `hermes-notice-offered` on key `hermes-notice:<effect id>`
at expected version 0: of all the turns and processes that see it, only the first append
wins, so a notice reaches one turn, once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from pulse_adapters.agents import notice_body, open_notice
from pulse_core import (
    AppendOutcomeUnknown,
    Event,
    EventDraft,
    EventStore,
    StoreError,
    VersionConflict,
    register_kind,
)

log = logging.getLogger("pulse.hermes")

NOTICE_OFFERED = "hermes-notice-offered"
NOTICE_HEADER = "[pulse] notices from the agent's nervous system (not from the user):"


class NoticeOffered(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of hermes-notice-offered: which effect, in which Hermes session."""

    effect: str
    tag: str
    session: str = ""


register_kind(NOTICE_OFFERED, "a pulse notice was offered to a Hermes turn (once per "
              "effect); key: hermes-notice:<effect id>", NoticeOffered)


def notice_key(effect_id: str) -> str:
    """The event key that records the offer of the notice effect `effect_id`."""
    return f"hermes-notice:{effect_id}"


def notice_line(body: dict[str, Any]) -> str:
    """One item for the agent: the notice text every host shows
    (`pulse_adapters.agents.notice_body`: a Notify's level, topic and text with its quoted
    texts fenced as data; another effect's fields, never its `env`; URLs cut)."""
    return f"- {notice_body(body)}"


def notice_context(lines: Sequence[str]) -> str:
    """The context a pre_llm_call hook returns for `lines`."""
    return "\n".join((NOTICE_HEADER, *lines))


class NoticeFollower:
    """Finds the notices a turn should be offered, and claims them.

    Looks at the newest `scan_limit` effect events at the first call and at those after the
    last one seen afterwards; a notice older than `max_age_ms` is never offered.
    """

    def __init__(self, tags: Sequence[str], *, max_age_ms: int, scan_limit: int = 200) -> None:
        self.tags = frozenset(tags)
        self.max_age_ms = max_age_ms
        self.scan_limit = scan_limit
        self._after: int | None = None
        # claims whose commit reply was lost, by effect id: sent again as they were (stored
        # once), so a claim that was stored is not taken for another turn's
        self._unsure: dict[str, EventDraft] = {}

    async def claim(self, events: EventStore, now_ms: int, session: str = "", *,
                    until: float | None = None) -> list[str]:
        """The lines of the notices claimed for this turn, oldest first. None is claimed
        once `time.monotonic()` passes `until` (the turn stopped waiting: a notice claimed
        then could reach no one); a store failure ends the claiming, keeping what was
        claimed so far and leaving the rest for the next call."""
        if not self.tags:
            return []
        if self._after is None:
            found = list(reversed(await events.read(kinds=["effect"], newest_first=True,
                                                    limit=self.scan_limit)))
            if not found:
                self._after = await events.last_seq()
        else:
            found = await events.read(self._after, kinds=["effect"])
        lines = []
        for event in found:
            if until is not None and time.monotonic() > until:
                break
            body = _notice_body(event, self.tags)
            if body is not None and now_ms - event.ts <= self.max_age_ms:
                draft = self._unsure.get(event.key) or self._offer(event, body, session)
                try:  # sealed memory text it quotes is opened only to be shown
                    shown = await asyncio.to_thread(open_notice, body, events.keys)
                    await events.append([draft], expect={draft.key: 0})
                except VersionConflict:
                    pass  # offered already, by another turn or process
                except StoreError as exc:  # the log's or keys.db's: the next turn tries again
                    if isinstance(exc, AppendOutcomeUnknown):  # ...with this very claim
                        self._unsure[event.key] = draft
                    log.warning("pulse plugin: notice %s not claimed: %s", event.key, exc)
                    break
                else:
                    lines.append(notice_line(shown))
            self._unsure.pop(event.key, None)  # claimed, offered already, or too old
            self._after = event.seq
        return lines

    @staticmethod
    def _offer(event: Event, body: dict[str, Any], session: str) -> EventDraft:
        """The claim of `event`'s notice for a turn of `session` (its own idempotency key)."""
        offer = NoticeOffered(effect=event.key, tag=str(body["type"]), session=session)
        return EventDraft(NOTICE_OFFERED, notice_key(event.key), msgspec.to_builtins(offer),
                          origin="agent:hermes", cause=event.seq,
                          idem=f"{NOTICE_OFFERED}:{uuid.uuid4().hex}")


def _notice_body(event: Event, tags: frozenset[str]) -> dict[str, Any] | None:
    body = event.data.get("effect") if isinstance(event.data, dict) else None
    if not isinstance(body, dict) or body.get("type") not in tags:
        return None
    return body
