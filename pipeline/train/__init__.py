"""The training core: the engine (one loop of rounds), the executors, grouped models, checkpoints."""
