"""Domain types of the router: workers, their load, route inputs and decisions, typed errors.

Plain frozen dataclasses with no transport, so the simulator can build them directly.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from engines.base.errors import (  # noqa: F401
    EngineError,
    InvalidRequestError,
    NoWorkerAvailableError,
    UnknownModelError,
    WorkersBusyError,
)
from engines.base.types import KvLayout
from services.common.roles import WorkerRole

# NOTE: the router's errors are the one hierarchy's (engines/base/errors.py); these names are its vocabulary
RouterError = EngineError
InvalidArgumentError = InvalidRequestError


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker says about itself when it registers; fixed for the life of its lease."""

    worker_id: str
    role: WorkerRole
    address: str
    model: str
    layout: KvLayout | None = None
    max_num_seqs: int = 0  # 0 = not reported; the load's value (or 1) stands in
    max_model_len: int = 0

    def validate(self) -> None:
        for name in ("worker_id", "address", "model"):
            if not getattr(self, name):
                raise InvalidArgumentError(f"worker {name} is required")


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """A worker's own account of its load, as of its last heartbeat."""

    num_waiting: int = 0
    num_running: int = 0
    num_held: int = 0  # prefill: requests whose KV awaits a pull
    num_blocks_used: int = 0
    num_blocks_total: int = 0
    max_num_seqs: int = 0
    prefix_hit_rate: float = 0.0
    # what a host or disk hit saves against recomputing (0: not measured, or no such tier)
    prefill_tokens_per_s: float = 0.0
    kv_bytes_per_token: float = 0.0
    kv_host_bytes_per_s: float = 0.0
    kv_disk_bytes_per_s: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A snapshot of one live worker as policies see it."""

    info: WorkerInfo
    load: WorkerLoad = WorkerLoad()
    num_inflight: int = 0  # routed here and not yet completed
    num_unreflected: int = 0  # of those, routed after the last load report
    lease_expires_in_s: float = 0.0
    num_inflight_tokens: int = 0  # the KV the in-flight requests added (uncached tokens), tracked by the router
    num_queued_prefill_tokens: int = 0  # uncached tokens of the requests it likely has not prefilled yet

    @property
    def worker_id(self) -> str:
        return self.info.worker_id

    @property
    def max_num_seqs(self) -> int:
        return self.info.max_num_seqs or self.load.max_num_seqs or 1


@dataclass(frozen=True, slots=True)
class RouteInput:
    req_id: str
    model: str
    token_ids: Sequence[int] = ()  # a tuple, or a RouteRequest's repeated field (not copied: see convert.py)
    exclude_worker_ids: frozenset[str] = frozenset()
    # the prompt's chained block hashes as the gateway computed them (engines/base/block_hash.py), for blocks of
    # `hash_block_size` tokens; empty: the router hashes the prompt itself
    block_hashes: tuple[int, ...] = ()
    hash_block_size: int = 0
    hash_root: int = 0  # the first block's parent: block_hash.chain_root(the request's cache_salt, the secret)

    def validate(self) -> None:
        if not self.req_id:
            raise InvalidArgumentError("req_id is required")
        if not self.model:
            raise InvalidArgumentError("model is required")
        if self.block_hashes and (
            self.hash_block_size < 1 or len(self.block_hashes) != len(self.token_ids) // self.hash_block_size
        ):
            raise InvalidArgumentError(
                f"{len(self.block_hashes)} block hashes do not fit {len(self.token_ids)} "
                f"tokens in blocks of {self.hash_block_size}"
            )


@dataclass(frozen=True, slots=True)
class Choice:
    """A policy's pick, with its estimate of the prompt tokens that worker already holds (0: no estimate)."""

    view: WorkerView
    num_cached_tokens: int = 0

    @property
    def worker_id(self) -> str:
        return self.view.worker_id


@dataclass(frozen=True, slots=True)
class DisaggDecision:
    prefill: WorkerView | None  # None: the decode worker prefills locally
    reason: str


@dataclass(frozen=True, slots=True)
class RouteDecision:
    decode: WorkerView
    prefill: WorkerView | None
    policy: str
    num_cached_tokens: int  # the estimated prefix overlap on the decode worker
    reason: str  # why prefill was (not) disaggregated


def tier_load(stats) -> dict[str, float]:
    """The WorkerLoad fields an engine's stats (EngineStats) give about its KV tiers."""
    return {
        "prefill_tokens_per_s": stats.prefill_tokens_per_s,
        "kv_bytes_per_token": stats.kv_bytes_per_token,
        "kv_host_bytes_per_s": stats.kv_host_bytes_per_s,
        "kv_disk_bytes_per_s": stats.kv_disk_bytes_per_s,
    }
