"""What a Cursor run's stream-json output says: the NDJSON events of `agent -p
--output-format stream-json` (docs/cursor.md lists the events and where they are documented)
folded into one CursorOutcome."""

from __future__ import annotations

from typing import Any

import msgspec

from pulse_adapters.agents import AgentOutputError, AgentResult, AgentStream


class CursorOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """One Cursor run as its stream tells it: the final text (`result` of the terminal
    event), the session, model and workspace of the `system` init event, Cursor's own timings
    and request id, and how many assistant messages and tool calls it made."""

    text: str
    subtype: str
    session_id: str | None = None
    model: str | None = None
    cwd: str | None = None
    request_id: str | None = None
    duration_ms: int | None = None
    duration_api_ms: int | None = None
    assistant_messages: int = 0
    tool_calls: int = 0


def _text(event: dict[str, Any]) -> str:
    """The text parts of an assistant event's message."""
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return ""
    return "".join(part["text"] for part in content
                   if isinstance(part, dict) and isinstance(part.get("text"), str))


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_stream(stream: AgentStream) -> AgentResult:
    """The AgentResult of a run that exited with 0: ok with a CursorOutcome (as builtins) when
    the terminal `result` event says success; not ok, with the result's text, when it says
    `is_error`. AgentOutputError when a line is not a JSON object, an event has no `type`, or
    the stream ends without a `result` event."""
    init: dict[str, Any] = {}
    final: dict[str, Any] | None = None
    assistant = tools = 0
    last_text = ""
    for number, event in enumerate(stream.json_lines(), start=1):
        kind = event.get("type")
        if not isinstance(kind, str):
            raise AgentOutputError(f"event {number} has no `type`: {str(event)[:200]}")
        if kind == "system" and event.get("subtype") == "init":
            init = event
        elif kind == "assistant":
            assistant += 1
            last_text = _text(event) or last_text
        elif kind == "tool_call" and event.get("subtype") == "started":
            tools += 1
        elif kind == "result":
            final = event
        # other types (user, thinking, future ones) carry nothing the task needs
    if final is None:
        cut = " (the output was cut at the stream limits)" if stream.truncated else ""
        raise AgentOutputError(f"the stream ended without a `result` event after "
                               f"{len(stream.lines)} lines{cut}")
    text = _str(final.get("result"))
    outcome = CursorOutcome(
        text=last_text if text is None else text, subtype=str(final.get("subtype", "")),
        session_id=_str(final.get("session_id")) or _str(init.get("session_id")),
        model=_str(init.get("model")), cwd=_str(init.get("cwd")),
        request_id=_str(final.get("request_id")), duration_ms=_int(final.get("duration_ms")),
        duration_api_ms=_int(final.get("duration_api_ms")), assistant_messages=assistant,
        tool_calls=tools)
    if final.get("is_error") is True or outcome.subtype not in ("success", ""):
        return AgentResult(ok=False, result=msgspec.to_builtins(outcome),
                           error=f"result {outcome.subtype or 'error'}: {outcome.text[:300]}",
                           session=outcome.session_id)
    return AgentResult(ok=True, result=msgspec.to_builtins(outcome), session=outcome.session_id)
