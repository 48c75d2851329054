"""TrtllmConfig: what a TensorRT-LLM worker engine is asked to run, frozen. Built from the worker's settings
(services/common/engine_factory.py); what TensorRT-LLM measures at start-up is reported, never written back."""

from dataclasses import dataclass

from engines.base.engine_configs import BatchConfig, CacheConfig, TransferConfig
from engines.transfer import transports

# the release this adapter is written against (docker/worker-trtllm.Dockerfile pins the same image)
TRTLLM_VERSION = "1.2.1"


@dataclass(frozen=True, slots=True)
class TrtllmConfig:
    model: str  # a Hugging Face checkpoint directory, or a prebuilt TensorRT engine directory
    dtype: str = "bfloat16"
    device: str = "cuda"
    # max_batch_size, max_num_tokens, max_seq_len (0: the checkpoint's), enable_block_reuse (and KV events)
    batch: BatchConfig = BatchConfig()
    # tokens_per_block (the router hashes prompts in blocks of it); num_blocks > 0: exactly this many, 0: sized
    # from gpu_memory_utilization (vLLM's meaning: the share of the whole card); its own tiers (no G2/G3 here)
    cache: CacheConfig = CacheConfig()
    # kv_transport: always TensorRT-LLM's own transceiver; held_kv_ttl_s: a prefilled request's KV no decode worker
    # took is let go after this long
    transfer: TransferConfig = TransferConfig(transports.TRTLLM)
    backend: str = "auto"  # "pytorch" | "tensorrt" | "auto" (tensorrt for an engine directory)
    quant: str = ""  # "" | "fp8" | "nvfp4": weights
    kv_cache_dtype: str = "auto"  # "auto" | "fp8"
    cache_transceiver: str = "DEFAULT"  # TensorRT-LLM's KV transfer backend; "off": no disaggregation
    tensor_parallel_size: int = 1
    options_file: str = ""  # JSON object of further LLM(...) keyword arguments, applied last
    kv_hash_root: int = 0  # KV events' unsalted chain root: block_hash.chain_root("", TANDEM_KV_HASH_SECRET)

    @property
    def disaggregation(self) -> bool:
        return self.cache_transceiver != "off"
