"""What every service shares: generated protos, conversions, errors, gRPC bootstrap, settings."""
