"""tandem: disaggregated LLM inference — gateway, router, prefill/decode workers and their tooling."""
