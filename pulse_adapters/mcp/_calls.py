"""What every tool call goes through before it may write: the agent's rate limit and the
checks of its arguments, each refusal an MCP tool error whose text starts with the field."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from mcp.server.fastmcp.exceptions import ToolError

from pulse_adapters.mcp._settings import McpSettings
from pulse_core import (
    MAX_KEY_LENGTH,
    Clock,
    ElementTextUnreadable,
    Event,
    EventDraft,
    EventStore,
    InvalidEvent,
    Memory,
    SystemClock,
    VersionConflict,
    check_text,
    identity_key,
    register_kind,
)
from pulse_core.store import reveal

CALL_REFUSED = "mcp-call-refused"
_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
RETRY_WINDOW_S = 600
"""How long after a memory write the same call again is taken for a retry of it (its answer
lost on the way), answered as the first was instead of written twice."""
_RECENT = 50  # the agent's newest writes of one kind about an identity looked through
_TRIES = 5  # writes raced by another writer of the same identity before giving up


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
    and the argument checks every tool shares. `clock` tells the retry window's time (the
    store's clock stamps what it stores)."""

    def __init__(self, store: EventStore, settings: McpSettings, *,
                 clock: Clock | None = None) -> None:
        self.store = store
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
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

    async def write_once(self, identity: str, kind: str, body: Any,
                         same: Callable[[Mapping[str, Any]], bool]) -> tuple[Event, bool]:
        """Append `kind` with `body` about known `identity` as this agent, unless this agent
        wrote a `kind` about it in the last RETRY_WINDOW_S whose data (its text revealed)
        `same` accepts: a retry of a call whose answer was lost. The event, and whether it
        is new. The check and the write hold the identity's version, so a retry racing the
        first call (in this process or another) still writes once."""
        key = identity_key(identity)
        data = msgspec.to_builtins(body)
        for _ in range(_TRIES):
            version = await self.store.head(key)
            earlier = await self._recent(key, kind, same)
            if earlier is not None:
                return earlier, False
            draft = EventDraft(kind, key, data, origin=self.origin)
            try:
                return (await self.store.append([draft], expect={key: version})).events[0], True
            except VersionConflict:
                continue  # the identity moved meanwhile: look again
        raise ToolError(f"identity: {identity!r} is being written by others all the while "
                        "— call again in a moment")

    async def _recent(self, key: str, kind: str, same: Callable[[Mapping[str, Any]], bool]
                      ) -> Event | None:
        """This agent's newest `kind` on `key` within RETRY_WINDOW_S that `same` accepts."""
        since = self.clock.now_ms() - RETRY_WINDOW_S * 1000
        for event in await self.store.read(kinds=[kind], key=key, newest_first=True,
                                           limit=_RECENT, origin_prefix=self.origin):
            if event.ts < since:
                break
            if event.origin != self.origin or not isinstance(event.data, dict):
                continue
            try:
                data = reveal(event.data, self.store.keys, purged=None)
            except ElementTextUnreadable:
                continue  # purged (or its key gone): nothing to answer with
            if same(data):
                return event
        return None
