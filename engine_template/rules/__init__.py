"""Business rules: onion middleware `(prev, curr, inner) -> Decision`, in engine.layer's rules."""
