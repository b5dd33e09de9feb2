"""pulse_adapters: filled by a later issue."""
