"""pulse_adapters: what connects pulse to models and agents. Each subpackage names its own
public surface: `pulse_adapters.llm` (the OpenAI-compatible client and route health) and
`pulse_adapters.awareness` (the reviewer). OpenClaw, Cursor and Hermes adapters come later."""
