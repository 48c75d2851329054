"""tandem's own PyTorch engine: paged KV cache, prefix caching, continuous batching."""
