"""What an agent run wrote, as a host's parser sees it, and what the parser makes of it."""

from __future__ import annotations

from typing import Any

import msgspec

from pulse_core import PulseError


class AgentOutputError(PulseError):
    """An agent's output is not what its host's protocol says (a line that is not JSON, no
    final result); the message says which line and what was expected."""


class AgentStream(msgspec.Struct, frozen=True):
    """An agent process's output: stdout as lines (UTF-8, bad bytes replaced, without line
    ends), the tail of stderr, the exit code, whether a bound cut the output, and the numbers
    (from 1) of the lines a bound cut short."""

    lines: tuple[str, ...]
    stderr_tail: str
    exit_code: int | None
    truncated: bool = False
    cut_lines: tuple[int, ...] = ()

    def json_lines(self) -> list[dict[str, Any]]:
        """Every non-empty stdout line as a JSON object (NDJSON), leaving out the lines a
        bound cut short (`cut_lines`: what is left of them is not the event they were);
        AgentOutputError naming the first other line that is not one."""
        found: list[dict[str, Any]] = []
        cut = frozenset(self.cut_lines)
        for number, line in enumerate(self.lines, start=1):
            if not line.strip() or number in cut:
                continue
            try:
                value = msgspec.json.decode(line)
            except (msgspec.DecodeError, RecursionError) as exc:  # or nested too deep to decode
                raise AgentOutputError(f"stdout line {number} is not JSON ({exc}): "
                                       f"{line[:200]!r}") from None
            if not isinstance(value, dict):
                raise AgentOutputError(f"stdout line {number} is JSON but not an object: "
                                       f"{line[:200]!r}")
            found.append(value)
        return found


class AgentResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a host's parser made of a run: `ok` (the agent says it did the task), `result`
    (JSON-encodable, stored in `task-acked`), `error` (why not, when not ok) and the host's
    `session` id when it has one."""

    ok: bool = True
    result: Any = None
    error: str | None = None
    session: str | None = None
