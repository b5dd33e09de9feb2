"""This engine's own tests: `pytest` in the engine directory; promote runs them."""
