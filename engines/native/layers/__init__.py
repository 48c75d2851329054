"""Model building blocks: norms, rotary embeddings, (merged) linear layers with weight loaders."""
