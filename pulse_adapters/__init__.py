"""pulse_adapters: model clients and agent adapters (OpenAI-compatible LLM, OpenClaw, Cursor,
Hermes); filled by the adapters and awareness issues."""
