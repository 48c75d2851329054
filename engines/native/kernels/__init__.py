"""Triton kernels for the native engine on CUDA, each with a launch wrapper and a PyTorch reference
it is tested against (on CPU under TRITON_INTERPRET=1). Importing this package imports no triton;
each kernel module does, so import them only where they are used."""
