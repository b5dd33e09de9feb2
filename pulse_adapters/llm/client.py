"""ChatClient: OpenAI-compatible chat completions, always streamed so a call can be cut short.

Speaks the protocol that llama.cpp's server, vLLM, Ollama, LiteLLM and hosted APIs share:
POST {base_url}/chat/completions with `stream: true`, answered by `data: {chunk}` lines and a
final `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

from pulse_adapters.llm.errors import (
    HttpStatusError,
    InferenceTimeout,
    LlmError,
    MalformedStream,
    Preempted,
    TransportError,
    excerpt,
)
from pulse_adapters.llm.stream import Completion, StreamReader

JSON_OBJECT: Mapping[str, Any] = {"type": "json_object"}
"""response_format asking for any JSON object (no schema); the fallback for json_schema."""

_BODY_EXCERPT_BYTES = 4096


def json_schema_format(name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """response_format asking for JSON that follows `schema` (strict, as OpenAI defines it)."""
    return {"type": "json_schema",
            "json_schema": {"name": name, "schema": dict(schema), "strict": True}}


class ChatClient:
    """Chat completions from one model at one OpenAI-compatible server.

    `base_url` ends in the API version, e.g. "http://127.0.0.1:8080/v1". `timeout_s` bounds
    connecting and each silence of the server; `max_wall_s` bounds a whole `complete` call,
    however steadily tokens arrive. Pass `http` to share a connection pool; the caller then
    closes it, otherwise `aclose` (or `async with`) does.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 60.0,
        max_wall_s: float = 180.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url {base_url!r} must start with http:// or https://, "
                             "e.g. 'http://127.0.0.1:8080/v1'")
        if timeout_s <= 0 or max_wall_s <= 0:
            raise ValueError(f"timeout_s ({timeout_s}) and max_wall_s ({max_wall_s}) must be "
                             "positive seconds")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.max_wall_s = max_wall_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = http or httpx.AsyncClient()
        self._owns_http = http is None
        self._json_schema_supported: bool | None = None

    @property
    def json_schema_supported(self) -> bool | None:
        """Whether this server accepted a json_schema response_format (None: not tried yet).

        Once a json_schema request was refused (HTTP 400 or 422) and the same request with
        json_object was accepted, later calls ask for json_object straight away.
        """
        return self._json_schema_supported

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        response_format: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        cancel: asyncio.Event | None = None,
        max_chars: int | None = None,
    ) -> Completion:
        """Stream one answer to `messages` and return it whole.

        Setting `cancel` closes the stream at once and raises Preempted; past `max_wall_s` the
        stream is closed and InferenceTimeout raised; an answer longer than `max_chars` closes
        the stream and raises OutputTooLarge. Other failures raise the LlmError that names
        them.
        """
        started = time.perf_counter()
        if cancel is not None and cancel.is_set():
            raise self._preempted(started)
        body: dict[str, Any] = {"model": self.model, "messages": list(messages), "stream": True,
                                "stream_options": {"include_usage": True}}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if temperature is not None:
            body["temperature"] = temperature
        work = asyncio.create_task(self._negotiate(body, response_format, started, max_chars),
                                   name=f"chat-completion:{self.model}")
        waits: set[asyncio.Future[Any]] = {work}
        if cancel is not None:
            waits.add(asyncio.ensure_future(cancel.wait()))
        try:
            done, _ = await asyncio.wait(waits, timeout=self.max_wall_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        if work in done:
            return work.result()
        if cancel is not None and cancel.is_set():
            raise self._preempted(started)
        raise InferenceTimeout(
            f"model {self.model!r} at {self.url} did not finish within max_wall_s "
            f"({self.max_wall_s:g} s); the stream was closed — shorten the prompt or "
            "max_tokens, or raise max_wall_s",
            url=self.url, model=self.model,
        )

    async def models(self) -> list[str]:
        """The model ids the server lists at GET {base_url}/models."""
        url = f"{self.base_url}/models"
        try:
            response = await self._http.get(url, headers=self._headers,
                                             timeout=httpx.Timeout(self.timeout_s))
        except httpx.HTTPError as exc:
            raise self._transport(exc, url) from exc
        if not response.is_success:
            raise HttpStatusError(response.status_code, response.text, url=url, model=self.model)
        try:
            listing = response.json()
            return [str(entry["id"]) for entry in listing["data"]]
        except (ValueError, KeyError, TypeError):
            raise MalformedStream(
                f"{url} answered a model listing without data[].id: {excerpt(response.text)!r}"
                " — base_url may point at something that is not an OpenAI-compatible API",
                url=url, model=self.model,
            ) from None

    @property
    def url(self) -> str:
        """Where completions are posted."""
        return f"{self.base_url}/chat/completions"

    async def _negotiate(
        self, body: dict[str, Any], response_format: Mapping[str, Any] | None, started: float,
        max_chars: int | None,
    ) -> Completion:
        """One streamed request; a json_schema refused (400, 422) is asked again as json_object.

        The server is remembered as lacking json_schema only when the json_object request is
        accepted; a 400 that json_object does not cure was about something else.
        """
        schema = response_format is not None and response_format.get("type") == "json_schema"
        if schema and self._json_schema_supported is False:
            response_format = JSON_OBJECT
        if response_format is not None:
            body["response_format"] = dict(response_format)
        try:
            completion = await self._stream(body, started, max_chars)
        except HttpStatusError as refused:
            if refused.status not in (400, 422) or body.get(
                    "response_format", {}).get("type") != "json_schema":
                raise
            completion = await self._stream({**body, "response_format": dict(JSON_OBJECT)},
                                            started, max_chars)
            self._json_schema_supported = False
            return completion
        if schema and self._json_schema_supported is None:
            self._json_schema_supported = True
        return completion

    async def _stream(self, body: dict[str, Any], started: float,
                      max_chars: int | None) -> Completion:
        url = self.url
        reader = StreamReader(url=url, model=self.model, max_chars=max_chars)
        headers = {**self._headers, "Accept": "text/event-stream"}
        try:
            async with self._http.stream("POST", url, json=body, headers=headers,
                                         timeout=httpx.Timeout(self.timeout_s)) as response:
                if not response.is_success:
                    raise HttpStatusError(response.status_code, await _body_excerpt(response),
                                          url=url, model=self.model)
                async for line in response.aiter_lines():
                    reader.feed(line)
                    if reader.done:
                        break
        except httpx.HTTPError as exc:
            raise self._transport(exc, url) from exc
        return reader.completion(_ms(started))

    def _transport(self, exc: httpx.HTTPError, url: str) -> LlmError:
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
            return InferenceTimeout(
                f"{url} (model {self.model!r}) sent nothing for timeout_s "
                f"({self.timeout_s:g} s): {what} — the server is stuck or overloaded; retry "
                "later or raise timeout_s", url=url, model=self.model)
        return TransportError(
            f"cannot talk to {url} (model {self.model!r}): {what} — check that the server is "
            "running and that base_url is right", url=url, model=self.model)

    def _preempted(self, started: float) -> Preempted:
        return Preempted(
            f"request to model {self.model!r} at {self.url} was cancelled by its caller after "
            f"{_ms(started):g} ms; the stream was closed and the partial answer dropped",
            url=self.url, model=self.model,
        )

    async def aclose(self) -> None:
        """Close the HTTP connection pool, if this client opened it."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def _body_excerpt(response: httpx.Response) -> str:
    """The start of an error body, read no further than needed."""
    raw = bytearray()
    async for piece in response.aiter_bytes():
        raw += piece
        if len(raw) >= _BODY_EXCERPT_BYTES:
            break
    return excerpt(raw.decode("utf-8", errors="replace"))


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)
