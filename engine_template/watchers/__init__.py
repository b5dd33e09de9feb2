"""Watchers: what this engine senses, listed in engine.LAYER's watchers."""
