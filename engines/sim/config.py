"""The sim runner's backend sub-config: what only a sim engine is asked (its timing profile, how fast it runs, and
whether it holds a real KV cache). A worker reads each field as sim_<field>. Validation only: no I/O, no numpy."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SimOptions:
    profile: str = ""  # a shipped profile name or a profile JSON path; "": the default
    time_factor: float = 1.0  # multiplies every modelled step time (0: as fast as possible)
    kv_cache_mb: int = 0  # a real paged KV cache of this size (0: none, transfers are timed)
    kv_bytes_per_token: int = 131072  # KV bytes per token of that cache (Llama-3.1-8B in bf16)

    def __post_init__(self) -> None:
        if self.time_factor < 0:
            raise ValueError(f"sim_time_factor must be >= 0, got {self.time_factor}")
        if self.kv_bytes_per_token < 1 or self.kv_cache_mb < 0:
            raise ValueError("sim_kv_bytes_per_token must be >= 1 and sim_kv_cache_mb >= 0")

    @property
    def has_payload(self) -> bool:
        """Whether the runner holds a real paged KV cache (workers moving real bytes) rather than timing only."""
        return self.kv_cache_mb > 0
