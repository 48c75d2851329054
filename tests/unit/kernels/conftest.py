"""Kernel tests run Triton's interpreter on CPU (small shapes); on a CUDA machine, the real kernels."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: read when a kernel module is imported
