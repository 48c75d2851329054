"""Timing profiles: what one engine's steps cost (prefill, decode, KV capacity and transfer), as shipped JSON files,
fits of benchmark results or measured step times. Neutral ground: the sim runner (engines/sim), the planner's
performance model and the cluster simulator all read it; it imports no engine, no service and no torch."""
