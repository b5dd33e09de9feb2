"""The three kinds of answer every page's routes give: JSON, a refusal saying what was wrong,
and a live stream of server-sent events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from starlette.responses import JSONResponse, Response, StreamingResponse

SSE_HEADERS = {"x-accel-buffering": "no"}
"""Tells a reverse proxy in front of the UI not to buffer a live stream."""


def json_response(data: Any, status: int = 200) -> Response:
    """`data` (plain data or msgspec Structs) as JSON."""
    return Response(msgspec.json.encode(data), status_code=status,
                    media_type="application/json")


def problem(status: int, message: str) -> Response:
    """A refusal: `{"error": message}` with `status`."""
    return JSONResponse({"error": message}, status_code=status)


def live(messages: AsyncIterator[bytes]) -> Response:
    """A live stream of the SSE `messages`."""
    return StreamingResponse(messages, media_type="text/event-stream", headers=SSE_HEADERS)
