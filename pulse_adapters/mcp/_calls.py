"""What every tool call goes through before it may write: the agent's rate limit and the
checks of its arguments, each refusal an MCP tool error whose text starts with the field."""

from __future__ import annotations

import re
import time
from collections import deque

import msgspec
from mcp.server.fastmcp.exceptions import ToolError

from pulse_adapters.mcp._settings import McpSettings
from pulse_core import (
    MAX_KEY_LENGTH,
    EventDraft,
    EventStore,
    InvalidEvent,
    Memory,
    check_text,
    identity_key,
    register_kind,
)

CALL_REFUSED = "mcp-call-refused"
_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class CallRefused(msgspec.Struct, frozen=True):
    """mcp-call-refused: a tool call the server refused without storing it."""

    tool: str
    field: str
    reason: str


register_kind(CALL_REFUSED, "an MCP tool call pulse refused (rate limit); nothing it carried "
              "was stored; key: mcp:<agent>", CallRefused)


class Limiter:
    """At most `per_minute` calls in any sliding minute."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self.calls: deque[float] = deque()

    def allow(self) -> bool:
        """Whether one more call fits in the current minute (and count it if so)."""
        now = time.monotonic()
        while self.calls and now - self.calls[0] >= 60.0:
            self.calls.popleft()
        if len(self.calls) >= self.per_minute:
            return False
        self.calls.append(now)
        return True


class Calls:
    """The agent's calls over one store: who it is (`origin`, from settings), its rate limit,
    and the argument checks every tool shares."""

    def __init__(self, store: EventStore, settings: McpSettings) -> None:
        self.store = store
        self.settings = settings
        self.origin = f"agent:{settings.agent}"
        self.key = f"mcp:{settings.agent}"
        self.limiter = Limiter(settings.calls_per_minute)

    async def admit(self, tool: str) -> None:
        """Count one call of `tool`; past the rate limit, record `mcp-call-refused` and
        refuse it on `rate`."""
        if self.limiter.allow():
            return
        reason = (f"more than {self.settings.calls_per_minute} calls a minute from agent "
                  f"{self.settings.agent}; wait a minute and call again")
        await self.store.append([EventDraft(
            CALL_REFUSED, self.key, msgspec.to_builtins(CallRefused(tool, "rate", reason)),
            origin=self.origin)])
        raise ToolError(f"rate: {reason}")

    def text(self, value: str, field: str) -> str:
        """`value` if it is non-empty storable text of at most `max_text` characters."""
        try:
            check_text(value, field, "mcp")
        except InvalidEvent as exc:
            raise ToolError(f"{field}: {exc}") from None
        if not value.strip():
            raise ToolError(f"{field}: is empty — give some text")
        if len(value) > self.settings.max_text:
            raise ToolError(f"{field}: {len(value)} characters; at most "
                            f"{self.settings.max_text} are accepted — send a shorter one")
        return value

    @staticmethod
    def ident(value: str, field: str) -> str:
        """`value` if it is an id: 1 to 64 of A-Z, a-z, 0-9, `_`, `.`, `-`."""
        if not _ID.fullmatch(value):
            raise ToolError(f"{field}: {value[:80]!r} is not an id — 1 to 64 of A-Z, a-z, 0-9, "
                            "`_`, `.`, `-`")
        return value

    @staticmethod
    def within(value: int, field: str, low: int, high: int) -> int:
        """`value` if it lies in low..high."""
        if not low <= value <= high:
            raise ToolError(f"{field}: {value} is outside {low} to {high}")
        return value

    @staticmethod
    def one_of(value: str, field: str, allowed: tuple[str, ...]) -> str:
        """`value` if it is one of `allowed`."""
        if value not in allowed:
            raise ToolError(f"{field}: {value[:80]!r} is not one of {', '.join(allowed)}")
        return value

    async def known(self, identity: str) -> str:
        """`identity` if pulse's memory holds it; the tools never make one."""
        self.text(identity, "identity")
        if len(identity_key(identity)) > MAX_KEY_LENGTH or not await self.store.read(
                kinds=Memory.kinds, key=identity_key(identity), limit=1):
            raise ToolError(f"identity: {identity!r} is not known to pulse — use only "
                            "identities pulse has memory of")
        return identity
