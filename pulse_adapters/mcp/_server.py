"""pulse's MCP server: the agent's tools over the home's stores, as the configured agent."""

from __future__ import annotations

import time
from collections import deque

import msgspec
from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError

from pulse_adapters.maintenance import MaintenanceCycles, cycle_history
from pulse_adapters.mcp._recall import Lookup
from pulse_adapters.mcp._settings import McpSettings
from pulse_core import (
    MAX_KEY_LENGTH,
    EventDraft,
    EventStore,
    InvalidEvent,
    Memory,
    MemoryBoard,
    Projector,
    TaskBoard,
    VersionConflict,
    check_text,
    identity_key,
    register_kind,
)

CALL_REFUSED = "mcp-call-refused"
MAX_RECALLED = 50
MAX_PRIORITY = 1_000


class CallRefused(msgspec.Struct, frozen=True):
    """mcp-call-refused: a tool call the server refused without storing it."""

    tool: str
    field: str
    reason: str


register_kind(CALL_REFUSED, "an MCP tool call pulse refused (rate limit); nothing it carried "
              "was stored; key: mcp:<agent>", CallRefused)


class _Limiter:
    """At most `per_minute` calls in any sliding minute."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self.calls: deque[float] = deque()

    def allow(self) -> bool:
        now = time.monotonic()
        while self.calls and now - self.calls[0] >= 60.0:
            self.calls.popleft()
        if len(self.calls) >= self.per_minute:
            return False
        self.calls.append(now)
        return True


class PulseMcp:
    """The tools one agent (McpSettings.agent) calls; `store` must be opened with that
    agent's principal, so every write passes the home's principal and origin checks."""

    def __init__(self, store: EventStore, settings: McpSettings) -> None:
        self.store = store
        self.settings = settings
        self.origin = f"agent:{settings.agent}"
        self.limiter = _Limiter(settings.calls_per_minute)
        self.lookup = Lookup(store)
        self.server = FastMCP("pulse", log_level="WARNING")
        self.server.add_tool(self.remember, name="remember", description=(
            "Remember a fact about a known identity (a person pulse has memory of)."))
        self.server.add_tool(self.recall, name="recall", description=(
            "What pulse recalls about an identity whose text holds every word of the query, "
            "best first (authority, confidence, memory strength, recency); archived and "
            "forgotten elements left out."))
        self.server.add_tool(self.create_task, name="create_task", description=(
            "Create a task on pulse's task board (a new id, a title, an optional prompt)."))
        self.server.add_tool(self.task_state, name="task_state", description=(
            "A task's current state: status, agent, result, reason."))
        self.server.add_tool(self.maintenance_report, name="maintenance_report", description=(
            "The report of the newest maintenance cycle that ended (empty when none has)."))

    async def _admit(self, tool: str) -> None:
        if self.limiter.allow():
            return
        reason = (f"more than {self.settings.calls_per_minute} calls a minute from agent "
                  f"{self.settings.agent}; wait a minute and call again")
        await self.store.append([EventDraft(
            CALL_REFUSED, f"mcp:{self.settings.agent}",
            msgspec.to_builtins(CallRefused(tool, "rate", reason)), origin=self.origin)])
        raise ToolError(f"rate: {reason}")

    def _text(self, value: str, field: str) -> str:
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

    async def _known(self, identity: str) -> str:
        self._text(identity, "identity")
        if len(identity_key(identity)) > MAX_KEY_LENGTH or not await self.store.read(
                kinds=Memory.kinds, key=identity_key(identity), limit=1):
            raise ToolError(f"identity: {identity!r} is not known to pulse — recall and "
                            "remember only identities pulse has memory of")
        return identity

    async def remember(self, identity: str, text: str) -> str:
        """Record `text` as a fact about `identity`; returns the stored record's id."""
        await self._admit("remember")
        self._text(text, "text")
        await self._known(identity)
        event = await MemoryBoard(self.store, origin=self.origin).fact(identity, text)
        return f"remembered as {event.data['record']} (event #{event.seq})"

    async def recall(self, identity: str, query: str, limit: int = 10) -> list[str]:
        """What is remembered about `identity` that matches `query`."""
        await self._admit("recall")
        self._text(query, "query")
        if not 1 <= limit <= MAX_RECALLED:
            raise ToolError(f"limit: {limit} is outside 1 to {MAX_RECALLED}")
        return await self.lookup(await self._known(identity), query, limit)

    async def create_task(self, task_id: str, title: str, prompt: str = "",
                          priority: int = 0) -> str:
        """Create task `task_id`; refused when the id is taken."""
        await self._admit("create_task")
        self._text(task_id, "task_id")
        if len(task_id) > MAX_KEY_LENGTH or task_id.startswith(("identity:", "mcp:")):
            raise ToolError(f"task_id: {task_id!r} is not a task id — at most "
                            f"{MAX_KEY_LENGTH} characters, not a pulse-reserved key")
        self._text(title, "title")
        if prompt:
            self._text(prompt, "prompt")
        if not 0 <= priority <= MAX_PRIORITY:
            raise ToolError(f"priority: {priority} is outside 0 to {MAX_PRIORITY}")
        try:
            event = await TaskBoard(self.store, origin=self.origin).create(
                task_id, title, prompt=prompt, priority=priority)
        except VersionConflict:
            raise ToolError(f"task_id: task {task_id!r} exists already — pick a new id"
                            ) from None
        return f"task {task_id} created (event #{event.seq})"

    async def task_state(self, task_id: str) -> dict[str, object]:
        """Task `task_id` as its events say now."""
        await self._admit("task_state")
        self._text(task_id, "task_id")
        state = await TaskBoard(self.store).state(task_id)
        if state is None:
            raise ToolError(f"task_id: no task {task_id!r} in pulse's log")
        shown: dict[str, object] = msgspec.to_builtins(state)
        return shown

    async def maintenance_report(self) -> dict[str, object]:
        """The newest ended maintenance cycle's report, with its cycle id."""
        await self._admit("maintenance_report")
        projection = MaintenanceCycles()
        states = await Projector(self.store, [projection]).catch_up()
        for row in cycle_history(states[projection.name]):
            if row["report"] is not None:
                return {"cycle": row["cycle"], "report": row["report"]}
        return {}
