"""The decode worker: imports KV from a prefill worker (or prefills locally) and streams tokens."""
