"""A simulated engine: the real scheduler and block manager priced by a timing profile."""
