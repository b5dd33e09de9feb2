"""Reading an OpenAI-style SSE stream: `data: {chunk}` lines up to `data: [DONE]`."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from pulse_adapters.llm.errors import EmptyOutput, MalformedStream, OutputTooLarge, excerpt


class Usage(msgspec.Struct, frozen=True):
    """Token counts as the server reported them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class Completion(msgspec.Struct, frozen=True):
    """One finished answer: its text, the model the server says answered, why it stopped,
    how long the whole call took, and the token usage if the server sent it."""

    text: str
    model: str
    finish_reason: str | None
    duration_ms: float
    usage: Usage | None = None


class StreamReader:
    """Folds the lines of one streamed response into a Completion.

    Lines other than `data:` (comments such as `: keep-alive`, `event:`, `id:`, blank lines)
    are skipped. A chunk's `choices` may be empty (the usage chunk, Azure's filter chunk);
    `delta.content` may be null (role-only and reasoning chunks). Content past `max_chars`
    raises OutputTooLarge.
    """

    def __init__(self, *, url: str, model: str, max_chars: int | None = None) -> None:
        self.url = url
        self.model = model
        self.max_chars = max_chars
        self.done = False
        self._parts: list[str] = []
        self._chars = 0
        self._reported_model: str | None = None
        self._finish_reason: str | None = None
        self._usage: Usage | None = None

    def feed(self, line: str) -> None:
        """Take one line of the stream; sets `done` at `data: [DONE]`."""
        if not line.startswith("data:"):
            return
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise self._malformed(f"a data line that is not JSON: {excerpt(data)!r}") from None
        except RecursionError:
            raise self._malformed(f"a data line nested too deeply: {excerpt(data)!r}") from None
        if not isinstance(chunk, dict):
            raise self._malformed(f"a data line that is not a JSON object: {excerpt(data)!r}")
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            error = chunk.get("error")
            if error is not None:
                message = error.get("message", error) if isinstance(error, dict) else error
                raise self._malformed(f"an error in the stream: {excerpt(str(message))!r}")
            raise self._malformed(f"a chunk without choices: {excerpt(data)!r}")
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self._reported_model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self._usage = _usage(chunk["usage"])
        if choices and isinstance(choices[0], dict):
            self._choice(choices[0])

    def _choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, dict) and isinstance(delta.get("content"), str):
            self._parts.append(delta["content"])
            self._chars += len(delta["content"])
            if self.max_chars is not None and self._chars > self.max_chars:
                raise OutputTooLarge(
                    f"model {self.model!r} at {self.url} sent more than max_chars "
                    f"({self.max_chars:,}) characters; the stream was closed — lower "
                    "max_tokens, or raise max_chars if such answers are expected",
                    url=self.url, model=self.model)
        if isinstance(choice.get("finish_reason"), str):
            self._finish_reason = choice["finish_reason"]

    def completion(self, duration_ms: float) -> Completion:
        """The assembled answer; raises if the stream was cut short or carried no content."""
        if not self.done and self._finish_reason is None:
            raise self._malformed("a stream that ended before `data: [DONE]` and without a "
                                  "finish_reason")
        text = "".join(self._parts)
        if not text.strip():
            raise EmptyOutput(
                f"model {self.model!r} at {self.url} finished (finish_reason "
                f"{self._finish_reason!r}) without any content — check the prompt, and raise "
                "max_tokens if the reason is 'length'",
                url=self.url, model=self.model,
            )
        return Completion(text, self._reported_model or self.model, self._finish_reason,
                          duration_ms, self._usage)

    def _malformed(self, what: str) -> MalformedStream:
        return MalformedStream(
            f"{self.url} (model {self.model!r}) sent {what} — the server does not speak the "
            "OpenAI chat-completions stream, or a proxy between us changed it",
            url=self.url, model=self.model,
        )


def _usage(raw: dict[str, Any]) -> Usage:
    def count(name: str) -> int:
        value = raw.get(name)
        return value if isinstance(value, int) else 0

    return Usage(count("prompt_tokens"), count("completion_tokens"), count("total_tokens"))
