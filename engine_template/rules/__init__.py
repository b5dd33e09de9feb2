"""Business rules: onion middleware `(prev, curr, inner) -> Decision`, listed in engine.RULES."""
