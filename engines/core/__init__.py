"""What every engine backend shares: scheduler, block manager, sequences, EngineCore(config, runner), the
engine loop (in its own process inside a worker) and its client. Imports no torch."""
