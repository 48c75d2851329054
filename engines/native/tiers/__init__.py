"""The native runner's KV tiers below the device pool: host memory (G2) and local disk (G3)."""
