"""The watch tools: arm and disarm the agent's watches, and answer a fired watch's decision
through pulse_core.maintenance's decision record (once per fire)."""

from __future__ import annotations

from mcp.server.fastmcp.exceptions import ToolError

from pulse_adapters.mcp._calls import Calls
from pulse_core import (
    MAX_KEY_LENGTH,
    InvalidTransition,
    SystemClock,
    VersionConflict,
    identity_key,
    known_kinds,
)
from pulse_core.maintenance import (
    DECISIONS,
    DecisionConflict,
    WatchArmed,
    WatchCondition,
    arm_watch,
    decide_watch,
    disarm_watch,
    read_watch,
    watch_key,
)

MAX_KINDS = 20
MAX_DUE_MINUTES = 366 * 24 * 60  # a silence watch waits at most about a year
PRODUCES = ("sleep-task", "wake")


class WatchTools:
    """arm_watch, disarm_watch and answer_decision for the agent of `calls`."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    async def arm_watch(self, watch_id: str, watch_class: str = "delta", *,
                        identity: str = "", kinds: list[str] | None = None,
                        key_prefix: str = "", due_in_minutes: int | None = None,
                        reason: str = "", produces: str = "sleep-task") -> str:
        """Arm watch `watch_id` over changes to `identity` (or keys starting with
        `key_prefix`) of `kinds`; a silence watch fires when none came within
        `due_in_minutes`."""
        calls = self.calls
        await calls.admit("arm_watch")
        calls.ident(watch_id, "watch_id")
        calls.one_of(watch_class, "watch_class", ("delta", "silence"))
        calls.one_of(produces, "produces", PRODUCES)
        if identity and key_prefix:
            raise ToolError("identity: give identity or key_prefix, not both")
        prefix = identity_key(await calls.known(identity)) if identity else key_prefix
        if key_prefix:
            calls.text(key_prefix, "key_prefix")
            if len(key_prefix) > MAX_KEY_LENGTH:
                raise ToolError(f"key_prefix: longer than a key ({MAX_KEY_LENGTH} characters)")
        wanted = tuple(kinds or ())
        if len(wanted) > MAX_KINDS:
            raise ToolError(f"kinds: {len(wanted)} kinds; at most {MAX_KINDS}")
        catalogue = known_kinds()
        for kind in wanted:
            if kind not in catalogue:
                raise ToolError(f"kinds: {kind[:80]!r} is not a kind pulse logs")
        if not prefix and not wanted:
            raise ToolError("identity: a watch needs identity, key_prefix or kinds — one that "
                            "matches every change would fire at once")
        if reason:
            calls.text(reason, "reason")
        due_at = None
        if watch_class == "silence" and due_in_minutes is None:
            raise ToolError("due_in_minutes: a silence watch needs it (minutes until the "
                            "change is expected)")
        if due_in_minutes is not None:
            calls.within(due_in_minutes, "due_in_minutes", 1, MAX_DUE_MINUTES)
            due_at = SystemClock().now_ms() + due_in_minutes * 60_000
        if await self._armed_by(watch_id) not in (None, calls.origin):
            raise ToolError(f"watch_id: watch {watch_id!r} is another writer's — pick "
                            "another id")
        spec = WatchArmed(watch_class=watch_class, due_at=due_at, reason=reason,
                          produces=produces,
                          condition=WatchCondition(key_prefix=prefix, kinds=wanted))
        try:
            event = await arm_watch(calls.store, watch_id, spec, origin=calls.origin)
        except (InvalidTransition, VersionConflict):
            raise ToolError(f"watch_id: watch {watch_id!r} is armed already — disarm it "
                            "first, or pick another id") from None
        return f"watch {watch_id} armed (event #{event.seq})"

    async def disarm_watch(self, watch_id: str, reason: str = "") -> str:
        """Disarm `watch_id`, a watch this agent armed that has not fired."""
        calls = self.calls
        await calls.admit("disarm_watch")
        calls.ident(watch_id, "watch_id")
        if reason:
            calls.text(reason, "reason")
        watch = await read_watch(calls.store, watch_id)
        if watch is None or watch.status != "armed":
            raise ToolError(f"watch_id: no armed watch {watch_id!r}"
                            + ("" if watch is None else f" (it is {watch.status})"))
        if await self._armed_by(watch_id) != calls.origin:
            raise ToolError(f"watch_id: watch {watch_id!r} was armed by another writer — an "
                            "agent disarms only its own watches")
        try:
            event = await disarm_watch(calls.store, watch_id, origin=calls.origin,
                                       reason=reason)
        except (InvalidTransition, VersionConflict):
            raise ToolError(f"watch_id: watch {watch_id!r} moved meanwhile (fired or "
                            "disarmed) — list_notices shows what it did") from None
        return f"watch {watch_id} disarmed (event #{event.seq})"

    async def _armed_by(self, watch_id: str) -> str | None:
        """The origin that last armed `watch_id`, None when it never was."""
        armed = await self.calls.store.read(kinds=["watch-armed"], key=watch_key(watch_id),
                                            newest_first=True, limit=1)
        return armed[0].origin if armed else None

    async def answer_decision(self, watch_id: str, decision: str, reason: str = "") -> str:
        """Record `decision` for `watch_id`'s latest fire; the same answer again changes
        nothing, another one is refused naming the stored decision."""
        calls = self.calls
        await calls.admit("answer_decision")
        calls.ident(watch_id, "watch_id")
        calls.one_of(decision, "decision", DECISIONS)
        if reason:
            calls.text(reason, "reason")
        try:
            done = await decide_watch(calls.store, watch_id, decision, reason,
                                      origin=calls.origin)
        except DecisionConflict as exc:
            raise ToolError(f"decision: {exc}") from None
        except (InvalidTransition, VersionConflict) as exc:
            raise ToolError(f"watch_id: {exc}") from None
        if not done.ran:
            return f"watch {watch_id}: {decision!r} was recorded already; nothing changed"
        return f"watch {watch_id}: {decision!r} recorded"
