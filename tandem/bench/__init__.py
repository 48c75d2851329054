"""Benchmarks: `tandem bench engine` compares the native engine with Hugging Face transformers."""
