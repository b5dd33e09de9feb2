"""The notice tools: the notices pulse logged for the agent (the survival layer's Notify
effects, the agent-notices layer's among them) that it has not acknowledged, the fired
watches waiting for its decision, and the acknowledgement that takes a notice off the list.

A notice is acknowledged by appending `mcp-notice-acked` on key
`mcp-notice:<agent>:<effect id>` at expected version 0: the first acknowledgement is stored,
any later one finds it and changes nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec
from mcp.server.fastmcp.exceptions import ToolError

from pulse_adapters.agents import notice_body
from pulse_adapters.mcp._calls import Calls
from pulse_core import MAX_KEY_LENGTH, Event, EventDraft, Projector, VersionConflict, register_kind
from pulse_core.maintenance import Watches

NOTICE_ACKED = "mcp-notice-acked"
NOTICE_TAG = "notify"
SCAN = 500  # the newest effect events looked through for notices
MAX_LISTED = 50


class NoticeAcked(msgspec.Struct, frozen=True):
    """mcp-notice-acked: the agent acknowledged notice `effect` over MCP."""

    effect: str


register_kind(NOTICE_ACKED, "an agent acknowledged a pulse notice over MCP (once per agent "
              "and notice); key: mcp-notice:<agent>:<effect id>", NoticeAcked)


class NoticeTools:
    """list_notices and ack_notice for the agent of `calls`."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.watches = Watches()
        self.projector = Projector(calls.store, [self.watches])  # its fold kept between calls

    def _ack_key(self, effect_id: str) -> str:
        return f"mcp-notice:{self.calls.settings.agent}:{effect_id}"

    async def list_notices(self, limit: int = 20) -> dict[str, Any]:
        """Unacknowledged notices among the newest SCAN effects, newest first (at most
        `limit`), and the fired watches no one has decided yet."""
        calls = self.calls
        await calls.admit("list_notices")
        calls.within(limit, "limit", 1, MAX_LISTED)
        found = [e for e in await calls.store.read(kinds=["effect"], newest_first=True,
                                                   limit=SCAN) if _notify(e) is not None]
        acked: set[str] = set()
        if found:
            prefix = self._ack_key("")
            acked = {e.key for e in await calls.store.read(found[-1].seq, kinds=[NOTICE_ACKED])
                     if e.key.startswith(prefix)}
        notices = []
        for event in found:
            body = _notify(event)
            if body is None or self._ack_key(event.key) in acked:
                continue
            notices.append({"id": event.key, "seq": event.seq, "ts": event.ts,
                            "topic": body.get("topic"), "level": body.get("level"),
                            "text": notice_body(body)})
            if len(notices) == limit:
                break
        states = await self.projector.catch_up()
        waiting = [{"watch": w.id, "fired": w.produced, "reason": w.spec.reason}
                   for w in states[self.watches.name].values()
                   if w.status == "fired" and w.decision is None][:limit]
        return {"notices": notices, "decisions": waiting}

    async def ack_notice(self, notice_id: str) -> str:
        """Acknowledge notice `notice_id` (an id list_notices gave): it is not listed again."""
        calls = self.calls
        await calls.admit("ack_notice")
        calls.text(notice_id, "notice_id")
        if len(self._ack_key(notice_id)) > MAX_KEY_LENGTH:
            raise ToolError(f"notice_id: {notice_id[:80]!r} is not a notice id")
        effects = await calls.store.read(kinds=["effect"], key=notice_id, limit=1)
        if not effects or _notify(effects[0]) is None:
            raise ToolError(f"notice_id: no notice {notice_id[:80]!r} in pulse's log — "
                            "list_notices gives the ids")
        draft = EventDraft(NOTICE_ACKED, self._ack_key(notice_id),
                           msgspec.to_builtins(NoticeAcked(notice_id)), origin=calls.origin,
                           cause=effects[0].seq)
        try:
            event = (await calls.store.append([draft], expect={draft.key: 0})).events[0]
        except VersionConflict:
            return f"notice {notice_id} was acknowledged already; nothing changed"
        return f"notice {notice_id} acknowledged (event #{event.seq})"


def _notify(event: Event) -> dict[str, Any] | None:
    """The Notify an `effect` event holds, None for another effect."""
    body = event.data.get("effect") if isinstance(event.data, dict) else None
    return body if isinstance(body, dict) and body.get("type") == NOTICE_TAG else None
