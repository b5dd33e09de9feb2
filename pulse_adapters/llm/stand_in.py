"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for examples and tests.

It stands in for llama.cpp's `llama-server`, vLLM or a hosted API where a real model is not
wanted: it speaks HTTP/1.1 for real (keep-alive, chunked SSE streams) on an ephemeral port of
127.0.0.1 only. Each POST to /v1/chat/completions takes the next reply from a script::

    server.script(Stream(("Hel", "lo")), Status(500), Hang())

`ToolCall(name, arguments)` answers with a call of the tool `name` (finish reason
`tool_calls`), the way a model asks an agent host to run one of its tools.

A request when the script is empty gets HTTP 500 "no reply scripted". GET /v1/models answers
`server.models` (a model listing by default). `rejects_json_schema = True` makes the server
refuse every request whose response_format is json_schema with HTTP 400, as some servers do,
without taking a reply from the script. Every request is recorded in `requests`; a client that
hangs up mid-stream sets `disconnected`.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

LOOPBACK = "127.0.0.1"
API = "/v1"


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received; header names lower-cased."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


def read_request(handler: BaseHTTPRequestHandler) -> RecordedRequest:
    """The request `handler` is serving, body read, header names lower-cased."""
    length = int(handler.headers.get("Content-Length") or 0)
    body = handler.rfile.read(length) if length else b""
    return RecordedRequest(handler.command, handler.path,
                           {k.lower(): v for k, v in handler.headers.items()}, body)


class QuietHTTPServer(ThreadingHTTPServer):
    """A threaded HTTP server for loopback stand-ins: clients that hang up mid-answer are
    expected there, not errors worth printing."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass(frozen=True)
class Stream:
    """Stream `pieces` as chunks `delay_s` apart, then the finish chunk, usage (when the
    request asks for it) and `data: [DONE]`. Answers a non-streaming request in one JSON."""

    pieces: tuple[str, ...] = ("ok",)
    delay_s: float = 0.0
    finish_reason: str = "stop"
    model: str = "stand-in"


@dataclass(frozen=True)
class Status:
    """Answer HTTP `status` with `body`."""

    status: int
    body: str = '{"error": {"message": "scripted failure", "type": "server_error"}}'


@dataclass(frozen=True)
class Hang:
    """Read the request and send nothing at all until the server stops."""


@dataclass(frozen=True)
class InvalidLine:
    """Stream `pieces`, then `line` (not a valid chunk), then carry on as if nothing was wrong."""

    line: str = "data: {this is not json"
    pieces: tuple[str, ...] = ()


@dataclass(frozen=True)
class Drop:
    """Stream `pieces`, then close the connection in the middle of the chunked body."""

    pieces: tuple[str, ...] = ("partial",)


@dataclass(frozen=True)
class ToolCall:
    """Ask the client to call its tool `name` with `arguments` (sent as their JSON text):
    streamed as a tool-call delta and finish reason `tool_calls`, or in one JSON."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    call_id: str = "call-scripted-1"

    def call(self) -> dict[str, Any]:
        """The call as an OpenAI-style `tool_calls` item."""
        return {"id": self.call_id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments)}}


@dataclass(frozen=True)
class Models:
    """A GET /v1/models listing of `ids`."""

    ids: tuple[str, ...] = ("stand-in",)


Reply = Stream | Status | Hang | InvalidLine | Drop | ToolCall | Models


@dataclass
class ChatServer:
    """The scripted server. `start()` binds 127.0.0.1 on an ephemeral port; `stop()` releases
    every hanging or streaming handler and closes the port. Usable as a context manager."""

    rejects_json_schema: bool = False
    models: Reply = field(default_factory=Models)
    requests: list[RecordedRequest] = field(default_factory=list)
    disconnected: threading.Event = field(default_factory=threading.Event)
    _script: deque[Reply] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _http: QuietHTTPServer | None = None
    _thread: threading.Thread | None = None
    _port: int = 0

    @property
    def port(self) -> int:
        """The port the server listens on (0 before the first start; kept across restarts)."""
        return self._port

    @property
    def base_url(self) -> str:
        """What a ChatClient takes as base_url, e.g. http://127.0.0.1:40123/v1."""
        return f"http://{LOOPBACK}:{self.port}{API}"

    def script(self, *replies: Reply) -> None:
        """Queue replies for the next chat-completion requests, in order."""
        with self._lock:
            self._script.extend(replies)

    def chat_bodies(self) -> list[Any]:
        """The JSON bodies of the chat-completion requests received so far."""
        with self._lock:
            return [r.json() for r in self.requests if r.method == "POST"]

    def model_probes(self) -> int:
        """How many GET /v1/models requests arrived."""
        with self._lock:
            return sum(1 for r in self.requests if r.method == "GET")

    def start(self) -> ChatServer:
        """Listen on 127.0.0.1 (the port of the previous start, if any) in a daemon thread."""
        self._stopping = threading.Event()
        self._http = QuietHTTPServer((LOOPBACK, self._port), _handler(self))
        self._port = self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever,
                                        kwargs={"poll_interval": 0.02},
                                        name=f"ChatServer-{self._port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release every hanging or streaming handler and close the port."""
        self._stopping.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _next(self, request: RecordedRequest) -> Reply:
        if request.method == "GET":
            return self.models
        body = request.json()
        wants_schema = (body.get("response_format") or {}).get("type") == "json_schema"
        if self.rejects_json_schema and wants_schema:
            return Status(400, '{"error": {"message": "response_format json_schema is not '
                               'supported", "type": "invalid_request_error"}}')
        with self._lock:
            return self._script.popleft() if self._script else Status(
                500, '{"error": {"message": "chat_server: no reply scripted"}}')


class _ClientGone(Exception):
    """The client closed the connection while we were writing."""


def _handler(owner: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path != f"{API}/models":
                self._plain(404, '{"error": {"message": "not found"}}')
                return
            self._serve(self._recorded())

        def do_POST(self) -> None:
            request = self._recorded()
            if self.path != f"{API}/chat/completions":
                self._plain(404, '{"error": {"message": "not found"}}')
                return
            self._serve(request)

        def _recorded(self) -> RecordedRequest:
            request = read_request(self)
            owner._record(request)
            return request

        def _serve(self, request: RecordedRequest) -> None:
            reply = owner._next(request)
            try:
                self._answer(reply, request)
            except (_ClientGone, OSError):
                owner.disconnected.set()
                self.close_connection = True

        def _answer(self, reply: Reply, request: RecordedRequest) -> None:
            if isinstance(reply, Status):
                self._plain(reply.status, reply.body)
            elif isinstance(reply, Models):
                self._plain(200, json.dumps({"object": "list", "data": [
                    {"id": i, "object": "model", "owned_by": "chat_server"} for i in reply.ids]}))
            elif isinstance(reply, Hang):
                owner._stopping.wait()
                self.close_connection = True
            elif isinstance(reply, ToolCall):
                self._call(reply, request.json())
            else:
                body = request.json()
                if isinstance(reply, Stream) and not body.get("stream"):
                    self._plain(200, json.dumps(_whole(reply)))
                else:
                    self._stream(reply, body)

        def _open_stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def _stream(self, reply: Stream | InvalidLine | Drop, body: Any) -> None:
            self._open_stream()
            model = reply.model if isinstance(reply, Stream) else "stand-in"
            self._event(_chunk(model, {"role": "assistant", "content": ""}, None))
            delay = reply.delay_s if isinstance(reply, Stream) else 0.0
            for piece in reply.pieces:
                if delay and owner._stopping.wait(delay):
                    self.close_connection = True
                    return
                self._event(_chunk(model, {"content": piece}, None))
            if isinstance(reply, Drop):
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if isinstance(reply, InvalidLine):
                self._send_chunk(f"{reply.line}\n\n".encode())
            finish = reply.finish_reason if isinstance(reply, Stream) else "stop"
            self._event(_chunk(model, {}, finish))
            if (body.get("stream_options") or {}).get("include_usage"):
                self._event({**_chunk(model, {}, None), "choices": [],
                             "usage": _usage(body, reply.pieces)})
            self._send_chunk(b"data: [DONE]\n\n")
            self._send_chunk(b"")

        def _call(self, reply: ToolCall, body: Any) -> None:
            if not body.get("stream"):
                self._plain(200, json.dumps(_whole(reply)))
                return
            self._open_stream()
            self._event(_chunk("stand-in", {"role": "assistant", "content": None,
                                            "tool_calls": [{"index": 0, **reply.call()}]},
                               None))
            self._event(_chunk("stand-in", {}, "tool_calls"))
            if (body.get("stream_options") or {}).get("include_usage"):
                self._event({**_chunk("stand-in", {}, None), "choices": [],
                             "usage": _usage(body, ())})
            self._send_chunk(b"data: [DONE]\n\n")
            self._send_chunk(b"")

        def _event(self, chunk: dict[str, Any]) -> None:
            self._send_chunk(f"data: {json.dumps(chunk)}\n\n".encode())

        def _send_chunk(self, data: bytes) -> None:
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            except OSError as exc:
                raise _ClientGone from exc

        def _plain(self, status: int, text: str) -> None:
            payload = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def _chunk(model: str, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {"id": "chatcmpl-scripted", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _usage(body: Any, pieces: tuple[str, ...]) -> dict[str, int]:
    prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
    return {"prompt_tokens": prompt, "completion_tokens": len(pieces),
            "total_tokens": prompt + len(pieces)}


def _whole(reply: Stream | ToolCall) -> dict[str, Any]:
    if isinstance(reply, ToolCall):
        model, finish = "stand-in", "tool_calls"
        message: dict[str, Any] = {"role": "assistant", "content": None,
                                   "tool_calls": [reply.call()]}
    else:
        model, finish = reply.model, reply.finish_reason
        message = {"role": "assistant", "content": "".join(reply.pieces)}
    return {"id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "finish_reason": finish,
                                         "message": message}]}
