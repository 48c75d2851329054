"""Quantized layers run their GPU kernels in Triton's interpreter on CPU (small shapes); the real kernels on CUDA."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: read when a kernel module is imported
