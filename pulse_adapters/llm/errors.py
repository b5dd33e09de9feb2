"""What a chat-completions call can fail with, under one base.

::

    PulseError
    └── LlmError                    a chat-completions call did not produce an answer
        ├── TransportError          cannot connect, or the connection broke (with the URL)
        ├── HttpStatusError         the server answered a non-2xx status (code, body excerpt)
        ├── MalformedStream         a data line that is not JSON or not a completion chunk
        ├── EmptyOutput             the stream finished without any content
        ├── OutputTooLarge          the answer outgrew the caller's max_chars; the stream was cut
        ├── InferenceTimeout        the call outlived max_wall_s, or the server went silent
        └── Preempted               the caller's cancel event was set; the stream was closed

Every error carries `url` and `model`, and `route_failure`: whether it says the route itself is
broken (the caller then calls `RouteHealth.poison`) rather than this one request or the caller.
"""

from __future__ import annotations

from pulse_core import PulseError

EXCERPT_CHARS = 300


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """`text` on one line, cut to `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class LlmError(PulseError):
    """A chat-completions call did not produce an answer."""

    route_failure: bool = True

    def __init__(self, message: str, *, url: str, model: str) -> None:
        self.url = url
        self.model = model
        super().__init__(message)


class TransportError(LlmError):
    """The server could not be reached, or the connection broke before the answer was whole."""


class HttpStatusError(LlmError):
    """The server answered a status outside 2xx; `body` is a bounded excerpt of what it said.

    Statuses about this one request (400, 413, 422) are not route failures; the rest are.
    """

    REQUEST_STATUSES = frozenset({400, 413, 422})

    def __init__(self, status: int, body: str, *, url: str, model: str) -> None:
        self.status = status
        self.body = excerpt(body)
        self.route_failure = status not in self.REQUEST_STATUSES
        super().__init__(
            f"{url} answered HTTP {status} for model {model!r}: {self.body or '(empty body)'}"
            f" — {_status_advice(status)}",
            url=url, model=model,
        )


def _status_advice(status: int) -> str:
    if status in (401, 403):
        return "check api_key"
    if status == 404:
        return "check that base_url ends in /v1 and that the server serves this model"
    if status == 429:
        return "the server is rate limiting; retry later"
    if status < 500:
        return "the server refused this request; read its message above"
    return "the server failed; retry later, or restart it"


class MalformedStream(LlmError):
    """The server's answer does not follow the protocol: a data line that is not JSON or has no
    `choices`, an error object in the stream, a stream that stops before `[DONE]`, or a
    /models listing without `data`."""


class EmptyOutput(LlmError):
    """The stream finished properly but carried no content (or only whitespace)."""

    route_failure = False


class OutputTooLarge(LlmError):
    """The answer grew past the caller's `max_chars`; the stream was closed there."""

    route_failure = False


class InferenceTimeout(LlmError):
    """The call outlived its wall-clock cap (max_wall_s), or the server sent nothing for
    timeout_s."""


class Preempted(LlmError):
    """The caller set its cancel event; the HTTP stream was closed and the answer dropped."""

    route_failure = False
