"""Watchers: what this engine senses, listed in engine.layer's watchers."""
