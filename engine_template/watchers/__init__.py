"""Watchers: what this engine senses, listed in engine.WATCHERS."""
