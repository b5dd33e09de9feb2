"""Effects and the executors that carry them out, listed in engine.layer's executors."""
