"""pulse_survival: filled by a later issue."""
