"""Inference engines behind one protocol: native (PyTorch), sim (timing model), trtllm (lazy)."""
