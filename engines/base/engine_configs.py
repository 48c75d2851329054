"""The frozen sub-configs every engine backend shares: batching limits, the KV cache (blocks and tiers) and KV
transfer. A worker's settings build them once; a backend's config takes them whole instead of re-declaring their
fields. Validation only: no I/O, no torch, nothing measured is written back."""

from dataclasses import dataclass

from engines.transfer import transports

KV_TRANSPORTS = (*transports.SETTINGS, transports.TRTLLM)  # auto: resolved by the worker before an engine is built


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """How much one engine step may hold: the scheduler's limits."""

    max_num_seqs: int = 64  # running requests per step
    max_num_batched_tokens: int = 2048  # per-step token budget (chunked prefill)
    max_model_len: int = 0  # 0: the model's
    enable_prefix_caching: bool = True
    # a prompt longer than the step's budget is cut into chunks; off: it waits for a budget that holds it whole
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.max_model_len < 0:
            raise ValueError(f"max_model_len must be >= 0 (0: the model's), got {self.max_model_len}")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The paged KV cache: block size, the device pool, and the host (G2) and disk (G3) tiers below it."""

    block_size: int = 16  # tokens per KV block: the router hashes prompts in blocks of this size
    num_blocks: int = 0  # > 0: exactly this many device blocks; 0: sized from memory
    gpu_memory_utilization: float = 0.9  # GPU engines: the card's share this worker may fill, weights included
    kv_host_gb: float = 0.0  # G2: host memory for KV blocks beyond the device pool; 0: none
    kv_disk_dir: str = ""  # G3: local disk for KV blocks seen twice, kept across restarts; "": none
    kv_disk_gb: float = 0.0
    # CPU (or no GPU share): the device pool is this share of the memory available when num_blocks is 0
    kv_cache_memory_fraction: float = 0.3

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.num_blocks < 0:
            raise ValueError(f"block_size must be >= 1 and num_blocks >= 0, got {self.block_size}, {self.num_blocks}")
        if not 0 <= self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], or 0 for no card share, got {self.gpu_memory_utilization}"
            )
        if not 0 < self.kv_cache_memory_fraction <= 1:
            raise ValueError(f"kv_cache_memory_fraction must be in (0, 1], got {self.kv_cache_memory_fraction}")
        check_tier_sizes(self.kv_host_gb, self.kv_disk_dir, self.kv_disk_gb)


@dataclass(frozen=True, slots=True)
class TransferConfig:
    """How KV leaves and enters this engine: the transport, and how long exported blocks wait to be taken."""

    kv_transport: str = "auto"
    held_kv_ttl_s: float = 30.0  # a prefilled request's KV no decode worker took is let go after this long

    def __post_init__(self) -> None:
        if self.kv_transport not in KV_TRANSPORTS:
            raise ValueError(f"kv_transport must be one of {KV_TRANSPORTS}, got {self.kv_transport!r}")
        if self.held_kv_ttl_s <= 0:
            raise ValueError(f"held_kv_ttl_s must be > 0, got {self.held_kv_ttl_s}")


def check_tier_sizes(host_gb: float, disk_dir: str, disk_gb: float) -> None:
    """The KV tier settings every engine shares: sizes >= 0, and a disk tier only under a host tier."""
    if host_gb < 0 or disk_gb < 0:
        raise ValueError(f"kv_host_gb and kv_disk_gb must be >= 0, got {host_gb} and {disk_gb}")
    if bool(disk_dir) != (disk_gb > 0):
        raise ValueError("the disk KV tier needs both a directory (kv_disk_dir) and a size (kv_disk_gb)")
    if disk_gb > 0 and host_gb <= 0:
        raise ValueError(
            "the disk KV tier is fed from the host tier: set kv_host_gb too (host >= device KV, disk >= host)"
        )
