"""The prefill worker: prompt -> KV blocks + first token, blocks held under a lease until pulled."""
