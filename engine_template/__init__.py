"""engine_template: filled by a later issue."""
