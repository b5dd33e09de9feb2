"""Effects and the executors that carry them out, listed in engine.LAYER's executors."""
