"""Model definitions. One file covers the Llama family (Llama 2/3/3.1, Mistral, Qwen2/2.5, Qwen3)."""

from engines.native.models.llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM"]
