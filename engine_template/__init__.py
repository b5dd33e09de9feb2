"""engine_template: what `upulse init` copies into an engine directory (the CLI issue)."""
