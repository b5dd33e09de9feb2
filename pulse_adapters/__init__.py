"""pulse_adapters: model clients and agent adapters (OpenAI-compatible LLM, OpenClaw, Cursor,
Hermes); filled by the adapters and awareness issues."""

from pulse_adapters.llm import (
    JSON_OBJECT,
    ChatClient,
    Completion,
    EmptyOutput,
    HttpStatusError,
    InferenceTimeout,
    LlmError,
    MalformedStream,
    Preempted,
    RouteHealth,
    RouteProbeWatcher,
    TransportError,
    Usage,
    json_schema_format,
)

__all__ = [
    "JSON_OBJECT",
    "ChatClient",
    "Completion",
    "EmptyOutput",
    "HttpStatusError",
    "InferenceTimeout",
    "LlmError",
    "MalformedStream",
    "Preempted",
    "RouteHealth",
    "RouteProbeWatcher",
    "TransportError",
    "Usage",
    "json_schema_format",
]
