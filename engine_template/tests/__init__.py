"""This engine's own tests: `python -m pytest` in the engine directory; promote runs them."""
