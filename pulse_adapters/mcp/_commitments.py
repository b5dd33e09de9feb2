"""The commitment tools: what the agent promised, recorded as a memory element of an
identity (`commitment-made`), and closed (`commitment-updated`) once kept or dropped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp.server.fastmcp.exceptions import ToolError

from pulse_adapters.mcp._calls import RETRY_WINDOW_S, Calls
from pulse_core import MemoryBoard, SystemClock, identity_key, uuid7
from pulse_core.maintenance import CommitmentMade, CommitmentUpdated

IMPACTS = ("low", "normal", "high")
CLOSED = ("fulfilled", "cancelled")
MAX_DUE_MINUTES = 10 * 366 * 24 * 60  # about ten years


class CommitmentTools:
    """record_commitment and close_commitment for the agent of `calls`."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    async def record_commitment(self, identity: str, text: str,
                                due_in_minutes: int | None = None,
                                impact: str = "normal") -> str:
        """Record that the agent promised `text` to (or about) `identity`; returns the
        commitment's id, which close_commitment takes. The same promise again within
        RETRY_WINDOW_S (due as far ahead, give or take that window: a retry of a call whose
        answer was lost) is answered as the first call was, and recorded once."""
        calls = self.calls
        await calls.admit("record_commitment")
        calls.text(text, "text")
        calls.one_of(impact, "impact", IMPACTS)
        due_at = None
        if due_in_minutes is not None:
            calls.within(due_in_minutes, "due_in_minutes", 1, MAX_DUE_MINUTES)
            due_at = SystemClock().now_ms() + due_in_minutes * 60_000
        await calls.known(identity)
        body = CommitmentMade(record=f"c-{uuid7()}", text=text, due_at=due_at, impact=impact)

        def same(data: Mapping[str, Any]) -> bool:  # the same promise, due as far ahead
            if (data.get("text"), data.get("impact")) != (text, impact):
                return False
            made_due = data.get("due_at")
            if due_at is None or made_due is None:
                return made_due is due_at
            return bool(abs(made_due - due_at) <= RETRY_WINDOW_S * 1000)

        event, _ = await calls.write_once(identity, "commitment-made", body, same)
        return f"commitment {event.data['record']} recorded (event #{event.seq})"

    async def close_commitment(self, identity: str, commitment: str, status: str = "fulfilled",
                               reason: str = "") -> str:
        """Close `identity`'s commitment `commitment` as `status` (fulfilled or cancelled);
        closing it again the same way changes nothing."""
        calls = self.calls
        await calls.admit("close_commitment")
        calls.text(commitment, "commitment")
        calls.one_of(status, "status", CLOSED)
        if reason:
            calls.text(reason, "reason")
        await calls.known(identity)
        now = await self._status(identity, commitment)
        if now is None:
            raise ToolError(f"commitment: {identity!r} has no commitment {commitment[:80]!r} "
                            "— record_commitment returns the id")
        if now == status:
            return f"commitment {commitment} was {status} already; nothing changed"
        if now in CLOSED:
            raise ToolError(f"status: commitment {commitment} is {now} already — it is not "
                            f"made {status} afterwards")
        event = await MemoryBoard(calls.store, origin=calls.origin).write(
            identity, "commitment-updated",
            CommitmentUpdated(record=commitment, status=status, reason=reason))
        return f"commitment {commitment} {status} (event #{event.seq})"

    async def _status(self, identity: str, commitment: str) -> str | None:
        """The commitment's status as its events say, None when it was never made."""
        status = None
        for event in await self.calls.store.read(
                kinds=["commitment-made", "commitment-updated"], key=identity_key(identity)):
            if not isinstance(event.data, dict) or event.data.get("record") != commitment:
                continue
            if event.kind == "commitment-made":
                status = "pending"
            elif status is not None:
                status = str(event.data.get("status", status))
        return status
