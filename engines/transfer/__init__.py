"""KV transfer between engines: descriptors of held blocks, the paged cache as byte regions, NIXL, and the
shared-memory staging the gRPC fallback fills. Runners use it; no request lifecycles here."""
