"""Weight quantization: formats (FP8, NVFP4 references), the offline checkpoint transform, and the
runtime swap of linear layers. Imports no triton; CUDA kernels load lazily from engines.native.kernels."""
