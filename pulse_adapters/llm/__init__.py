"""OpenAI-compatible chat completions for pulse: a streaming client and route health."""

from pulse_adapters.llm.client import JSON_OBJECT, ChatClient, json_schema_format
from pulse_adapters.llm.endpoint import ModelEndpoint
from pulse_adapters.llm.errors import (
    EmptyOutput,
    HttpStatusError,
    InferenceTimeout,
    LlmError,
    MalformedStream,
    OutputTooLarge,
    Preempted,
    TransportError,
    excerpt,
)
from pulse_adapters.llm.health import ROUTE_KEY, RouteHealth, RouteProbeWatcher
from pulse_adapters.llm.stand_in import ChatServer, Stream
from pulse_adapters.llm.stream import Completion, Usage
from pulse_core import publish_face

__all__ = [
    "JSON_OBJECT",
    "ROUTE_KEY",
    "ChatClient",
    "ChatServer",
    "Completion",
    "EmptyOutput",
    "HttpStatusError",
    "InferenceTimeout",
    "LlmError",
    "MalformedStream",
    "ModelEndpoint",
    "OutputTooLarge",
    "Preempted",
    "RouteHealth",
    "RouteProbeWatcher",
    "Stream",
    "TransportError",
    "Usage",
    "excerpt",
    "json_schema_format",
]

publish_face(__name__)
