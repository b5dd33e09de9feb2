"""pulse's MCP server: the agent's tools over the home's stores, as the configured agent."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec
from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import ToolAnnotations

from pulse_adapters.maintenance import MaintenanceCycles, cycle_history
from pulse_adapters.mcp._calls import Calls
from pulse_adapters.mcp._commitments import CommitmentTools
from pulse_adapters.mcp._notices import NoticeTools
from pulse_adapters.mcp._recall import Lookup
from pulse_adapters.mcp._settings import McpSettings
from pulse_adapters.mcp._watches import WatchTools
from pulse_core import (
    MAX_KEY_LENGTH,
    EventStore,
    Projector,
    TaskBoard,
    VersionConflict,
    uuid7,
)
from pulse_core.memory import TemporalFactRecorded

MAX_RECALLED = 50
READ_ONLY = frozenset({"recall", "task_state", "maintenance_report", "list_notices"})
IDEMPOTENT = frozenset({"ack_notice", "answer_decision", "close_commitment"})  # again: no change
MAX_PRIORITY = 1_000


class PulseMcp:
    """The tools one agent (McpSettings.agent) calls; `store` must be opened with that
    agent's principal, so every write passes the home's principal and origin checks.
    `import_origins`: the writers recall ranks at background authority until a person
    verifies what they wrote (the home's maintenance `imports.origins`; None: pulse's
    defaults)."""

    def __init__(self, store: EventStore, settings: McpSettings, *,
                 import_origins: Iterable[str] | None = None) -> None:
        self.store = store
        self.settings = settings
        self.calls = Calls(store, settings)
        self.origin = self.calls.origin
        self.lookup = Lookup(store, import_origins)
        self.server = FastMCP("pulse", log_level="WARNING", host="127.0.0.1")  # its Host checks
        watches = WatchTools(self.calls)
        commitments = CommitmentTools(self.calls)
        notices = NoticeTools(self.calls)
        tools: tuple[tuple[Callable[..., Any], str], ...] = (
            (self.remember, "Remember a fact about a known identity (a person pulse has "
                            "memory of)."),
            (self.recall, "What pulse recalls about an identity whose text holds every word "
                          "of the query, best first (authority, confidence, memory strength, "
                          "recency); archived and forgotten elements left out."),
            (self.create_task, "Create a task on pulse's task board (a new id, a title, an "
                               "optional prompt)."),
            (self.task_state, "A task's current state: status, agent, result, reason."),
            (self.maintenance_report, "The report of the newest maintenance cycle that ended "
                                      "(empty when none has)."),
            (watches.arm_watch, "Arm a watch: be told when a matching change is logged "
                                "(delta), or when none came by a due time (silence)."),
            (watches.disarm_watch, "Disarm a watch this agent armed, before it fires."),
            (watches.answer_decision, "Answer a fired watch that waits for a decision: act, "
                                      "ask, defer or silence; recorded once per fire."),
            (commitments.record_commitment, "Record a commitment (something promised) for a "
                                            "known identity, optionally due in some minutes."),
            (commitments.close_commitment, "Close a commitment: fulfilled or cancelled."),
            (notices.list_notices, "The notices pulse has for this agent that it has not "
                                   "acknowledged, newest first, and the fired watches waiting "
                                   "for its decision."),
            (notices.ack_notice, "Acknowledge a notice, so it is not listed again."),
        )
        for tool, description in tools:
            reads = tool.__name__ in READ_ONLY
            self.server.add_tool(tool, name=tool.__name__, description=description,
                                 annotations=ToolAnnotations(
                                     readOnlyHint=reads, destructiveHint=False,
                                     idempotentHint=reads or tool.__name__ in IDEMPOTENT,
                                     openWorldHint=False))

    async def remember(self, identity: str, text: str) -> str:
        """Record `text` as a fact about `identity`; returns the stored record's id. The same
        fact again within RETRY_WINDOW_S (a retry of a call whose answer was lost) is
        answered as the first call was, and stored once."""
        await self.calls.admit("remember")
        self.calls.text(text, "text")
        await self.calls.known(identity)
        body = TemporalFactRecorded(record=f"f-{uuid7()}", text=text)
        event, _ = await self.calls.write_once(
            identity, "temporal-fact-recorded", body,
            lambda data: data.get("text") == text and data.get("valid_from") is None
            and data.get("valid_until") is None)
        return f"remembered as {event.data['record']} (event #{event.seq})"

    async def recall(self, identity: str, query: str, limit: int = 10) -> list[str]:
        """What is remembered about `identity` that matches `query`."""
        await self.calls.admit("recall")
        self.calls.text(query, "query")
        self.calls.within(limit, "limit", 1, MAX_RECALLED)
        return await self.lookup(await self.calls.known(identity), query, limit)

    async def create_task(self, task_id: str, title: str, prompt: str = "",
                          priority: int = 0) -> str:
        """Create task `task_id`; refused when the id is taken, unless by this very task
        (the same title, prompt and priority from the same agent: a retry of a call whose
        answer was lost), whose status is then told."""
        await self.calls.admit("create_task")
        self.calls.text(task_id, "task_id")
        if len(task_id) > MAX_KEY_LENGTH or task_id.startswith(("identity:", "mcp:")):
            raise ToolError(f"task_id: {task_id!r} is not a task id — at most "
                            f"{MAX_KEY_LENGTH} characters, not a pulse-reserved key")
        self.calls.text(title, "title")
        if prompt:
            self.calls.text(prompt, "prompt")
        self.calls.within(priority, "priority", 0, MAX_PRIORITY)
        try:
            event = await TaskBoard(self.store, origin=self.origin).create(
                task_id, title, prompt=prompt, priority=priority)
        except VersionConflict:
            first = (await self.store.read(key=task_id, limit=1))[0]
            if (first.kind, first.origin) != ("task-created", self.origin) or (
                    first.data.get("title"), first.data.get("prompt"),
                    first.data.get("priority")) != (title, prompt, priority):
                raise ToolError(f"task_id: task {task_id!r} exists already — pick a new id"
                                ) from None
            state = await TaskBoard(self.store).state(task_id)
            now = "" if state is None or state.status == "pending" else f"; {state.status} now"
            return f"task {task_id} created (event #{first.seq}){now}"
        return f"task {task_id} created (event #{event.seq})"

    async def task_state(self, task_id: str) -> dict[str, object]:
        """Task `task_id` as its events say now."""
        await self.calls.admit("task_state")
        self.calls.text(task_id, "task_id")
        state = await TaskBoard(self.store).state(task_id)
        if state is None:
            raise ToolError(f"task_id: no task {task_id!r} in pulse's log")
        shown: dict[str, object] = msgspec.to_builtins(state)
        return shown

    async def maintenance_report(self) -> dict[str, object]:
        """The newest ended maintenance cycle's report, with its cycle id."""
        await self.calls.admit("maintenance_report")
        projection = MaintenanceCycles()
        states = await Projector(self.store, [projection]).catch_up()
        for row in cycle_history(states[projection.name]):
            if row["report"] is not None:
                return {"cycle": row["cycle"], "report": row["report"]}
        return {}
