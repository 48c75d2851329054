"""TrtllmConfig: what a TensorRT-LLM worker engine is asked to run, frozen. Built from the worker's settings
(services/common/engine_factory.py); what TensorRT-LLM measures at start-up is reported, never written back."""

from dataclasses import dataclass

from engines.base.engine_configs import BatchConfig, CacheConfig, TransferConfig
from engines.transfer import transports

# the release this adapter is written against (docker/worker-trtllm.Dockerfile pins the same image)
TRTLLM_VERSION = "1.2.1"
TRTLLM_BACKENDS = ("auto", "pytorch", "tensorrt")
TRTLLM_QUANT = ("", "fp8", "nvfp4")
TRTLLM_KV_DTYPES = ("auto", "fp8")
TRTLLM_TRANSCEIVERS = ("DEFAULT", "UCX", "NIXL", "MPI", "off")


@dataclass(frozen=True, slots=True)
class TrtllmOptions:
    """The backend sub-config: what only a TensorRT-LLM engine is asked (a worker reads each as trtllm_<field>)."""

    backend: str = "auto"  # "pytorch" | "tensorrt" | "auto" (tensorrt for an engine directory)
    quant: str = ""  # "" | "fp8" | "nvfp4": weights
    kv_cache_dtype: str = "auto"  # "auto" | "fp8"
    cache_transceiver: str = "DEFAULT"  # TensorRT-LLM's KV transfer backend; "off": no disaggregation
    tensor_parallel_size: int = 1
    options: str = ""  # a JSON file of further LLM(...) keyword arguments, applied last

    def __post_init__(self) -> None:
        for name, allowed in (
            ("backend", TRTLLM_BACKENDS),
            ("quant", TRTLLM_QUANT),
            ("kv_cache_dtype", TRTLLM_KV_DTYPES),
            ("cache_transceiver", TRTLLM_TRANSCEIVERS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"trtllm_{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"trtllm_tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")


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
    trtllm: TrtllmOptions = TrtllmOptions()  # backend, quantization, KV dtype, transceiver, GPUs, extra arguments
    kv_hash_root: int = 0  # KV events' unsalted chain root: block_hash.chain_root("", TANDEM_KV_HASH_SECRET)

    @property
    def disaggregation(self) -> bool:
        return self.trtllm.cache_transceiver != "off"
