"""The agent-notices layer: what happened in the background, back in the agent's session.

A fired watch, an overdue commitment (as the maintenance cycle surfaces it), a watch whose
decision is "ask" (it needs the agent), and a finished or failed sleep task each become one
pulse_survival Notify, which the hosts (Hermes, OpenClaw) deliver to the agent's session."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from pulse_core import (
    Decision,
    Event,
    Inner,
    Layer,
    LayerContext,
    LayerError,
    Projection,
    Quote,
    Snapshot,
    layer_settings,
    redact_urls,
)
from pulse_core.maintenance import (
    WatchArmed,
    WatchDecided,
    WatchFired,
)
from pulse_core.store import is_sealed
from pulse_survival import Notify

LAYER = "agent-notices"
SOURCES = ("watch", "commitment", "decision", "task")
LEVELS = ("info", "warning", "critical")
KEPT = 64  # source events a projection holds between two ticks
REASONS_KEPT = 256  # armed watches whose reason is remembered for their fire
QUOTE_CHARS = 400  # a notice's quoted part (a task's outcome) is cut to this many characters


class AgentNoticesError(LayerError, ValueError):
    """A setting of the agent-notices layer is wrong; the message names the field."""


class AgentNoticesSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """config.json's `"layers": {"agent-notices": {...}}`: which sources become notices
    (`sources`, any of "watch", "commitment", "decision", "task"; default all four) and the
    level each notice carries (`level`: "info", "warning" or "critical"; default "info")."""

    sources: tuple[str, ...] = SOURCES
    level: str = "info"

    def __post_init__(self) -> None:
        for source in self.sources:
            if source not in SOURCES:
                raise ValueError(f"source {source!r} is not one of {', '.join(SOURCES)}")
        if self.level not in LEVELS:
            raise ValueError(f"level {self.level!r} is not one of {', '.join(LEVELS)}")


class SourceEvent(msgspec.Struct, frozen=True):
    """One event to tell the agent about: its seq, its source and the notice's parts."""

    seq: int
    source: str
    text: str
    quoted: str = ""


class FeedState(msgspec.Struct, frozen=True):
    """The latest source events (at most KEPT) and the reasons of armed watches."""

    recent: tuple[SourceEvent, ...] = ()
    reasons: dict[str, str] = {}


def agent_notice(source: str, level: str, text: str, quoted: str = "") -> Notify:
    """The one Notify a source event becomes: topic `agent-notices.<source>`, pulse's own
    `text`, and `quoted` (untrusted text such as a task's output, cut to QUOTE_CHARS) as a
    Quote labelled with the source, which hosts fence as data. Sealed memory text is quoted
    whole, still sealed: the log never holds its plain words, and a host opens it with the
    home's keys to show it (`open_notice`)."""
    kept = quoted if is_sealed(quoted) else redact_urls(quoted[:QUOTE_CHARS])
    quotes = (Quote(source=f"{LAYER}.{source}", text=kept),)
    return Notify(topic=f"{LAYER}.{source}", level=level, text=redact_urls(text),
                  quoted=quotes if quoted else ())


def _id(event: Event) -> str:
    return event.key.partition(":")[2] or event.key


def _data(event: Event) -> dict[str, Any]:
    return event.data if isinstance(event.data, dict) else {}


def _outcome(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _source_event(state: FeedState, event: Event) -> SourceEvent | None:
    name = _id(event)
    if event.kind == "watch-fired":
        fired = event.payload(WatchFired)
        why = state.reasons.get(name, "")
        cause = (f"a change (event #{fired.trigger_seq})" if fired.trigger_seq is not None
                 else "silence past its due time")
        return SourceEvent(event.seq, "watch", f"watch {name} fired on {cause}"
                           + (f" ({why})" if why else ""))
    if event.kind == "watch-decided":
        decided = event.payload(WatchDecided)
        if decided.decision != "ask":
            return None
        return SourceEvent(event.seq, "decision", f"watch {name} needs your decision"
                           + (f": {decided.reason}" if decided.reason else ""))
    if event.kind == "observation-recorded":
        body = _data(event)
        value = body.get("value")
        if body.get("key") != "commitment-overdue" or not isinstance(value, dict):
            return None
        words = value.get("text")  # sealed in a home: quoted whole, opened where shown
        return SourceEvent(event.seq, "commitment",
                           f"commitment {value.get('commitment', '?')} is overdue",
                           words if isinstance(words, str) else "")
    if event.kind == "sleep-task-completed":
        outcome = _data(event).get("outcome")
        return SourceEvent(event.seq, "task", f"sleep task {name} completed",
                           "" if outcome is None else _outcome(outcome))
    if event.kind == "sleep-task-failed":
        return SourceEvent(event.seq, "task", f"sleep task {name} failed",
                           str(_data(event).get("reason", "")))
    return None


class NoticeSources(Projection[FeedState]):
    """The latest events the agent is to be told of (at most KEPT), oldest first."""

    name = "agent-notices"
    kinds = frozenset({"watch-armed", "watch-fired", "watch-decided", "observation-recorded",
                       "sleep-task-completed", "sleep-task-failed"})

    def initial(self) -> FeedState:
        return FeedState()

    def apply(self, state: FeedState, event: Event) -> FeedState:
        if event.kind == "watch-armed":
            reasons = dict(state.reasons)
            reasons[_id(event)] = event.payload(WatchArmed).reason
            while len(reasons) > REASONS_KEPT:
                del reasons[next(iter(reasons))]
            return FeedState(state.recent, reasons)
        found = _source_event(state, event)
        if found is None:
            return state
        reasons = state.reasons
        if event.kind == "watch-fired" and _id(event) in reasons:
            reasons = {k: v for k, v in reasons.items() if k != _id(event)}
        return FeedState((*state.recent, found)[-KEPT:], reasons)


class AgentNoticesRule:
    """Each source event logged since the previous tick, of a source switched on, becomes
    one Notify (built by agent_notice) beside what the inner rules decide."""

    name = "agent-notices"
    emits = (Notify,)

    def __init__(self, settings: AgentNoticesSettings) -> None:
        self.settings = settings

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        decision = await inner(prev, curr)
        state: FeedState = curr.state(NoticeSources)
        fresh = [agent_notice(s.source, self.settings.level, s.text, s.quoted)
                 for s in state.recent
                 if s.seq > prev.seq and s.source in self.settings.sources]
        if not fresh:
            return decision
        return Decision([*decision.effects, *fresh], decision.tick_ms)


def notices_layer(settings: Any, context: LayerContext) -> Layer:
    """The agent-notices layer (entry point `agent-notices` in group `pulse.layers`), built
    from `settings` (AgentNoticesSettings, config.json's object, or None for the defaults).
    AgentNoticesError names a wrong setting."""
    valid = layer_settings(settings, AgentNoticesSettings, AgentNoticesError, LAYER)
    return Layer(LAYER, rules=(AgentNoticesRule(valid),), projections=(NoticeSources(),),
                 emits=(Notify,))
