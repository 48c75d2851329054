"""The sim runner: a step costs what a TimingProfile says instead of running a model, so the real worker
services (live, sleeping the modelled time x `time_factor`) and the cluster simulator (virtual time, no
sleeping) can run clusters of simulated GPUs over the one EngineCore. Tokens are deterministic. With KV
payloads on (workers), it holds a real paged cache of GPU-sized bytes per token and moves it as a real runner
does (NIXL or staging files); without (the cluster simulator), exports carry zero bytes. No torch."""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engines.base.engine_configs import BatchConfig, CacheConfig, TransferConfig
from engines.base.types import KvExport, KvLayout
from engines.core.engine_core import CoreConfig, EngineCore
from engines.core.runner import RunnerInfo, deterministic_token, zero_kv_export
from engines.core.sequence import Sequence
from engines.core.step import Sampled, SchedulerOutput
from engines.core.tiers.kv_tiers import TierSpec
from engines.core.tiers.modelled_tiers import ModelledTiers
from engines.sim.config import SimOptions
from engines.sim.kv_payload import SimKvCache, default_num_blocks, payload_layout
from engines.timing.profile import TimingProfile, load_profile
from engines.transfer import transports
from engines.transfer.mover import KvMover, MovedLoads

# NOTE: without a model directory, as large as the common tokenizers (Llama 3: 128256, Qwen2.5: 151665 ids)
VOCAB_SIZE = 152064
DEFAULT_MAX_MODEL_LEN = 131072


def next_token(seq: Sequence, vocab_size: int = VOCAB_SIZE) -> int:
    """A deterministic token: depends only on the sequence's length (and skips what it may not produce)."""
    return deterministic_token((seq.num_tokens * 7919 + 17) % vocab_size, seq.banned_token_ids(), vocab_size)


def model_vocab_size(model_dir: str) -> int:
    """The vocabulary of the checkpoint directory the worker is given (config.json), or VOCAB_SIZE without one."""
    path = Path(model_dir) / "config.json" if model_dir else None
    if path is None or not path.is_file():
        return VOCAB_SIZE
    return int(json.loads(path.read_text()).get("vocab_size") or VOCAB_SIZE)


def is_decode(num_new_tokens: int, start: int, seq: Sequence) -> bool:
    return num_new_tokens == 1 and start >= seq.num_prompt_tokens


@dataclass(slots=True)
class _Timed:
    sampled: list[Sampled]
    until: float  # when the modelled step ends (perf_counter); 0: no waiting (the simulator's virtual time)
    sleep: Callable[[float], None]

    def wait(self) -> list[Sampled]:
        left = self.until - time.perf_counter()
        if left > 0:
            self.sleep(left)
        return self.sampled


def sim_tiers(
    profile: TimingProfile, host_gb: float, disk_gb: float, clock: Callable[[], float], time_factor: float
) -> ModelledTiers | None:
    """Host and disk tiers of `host_gb` and `disk_gb` per worker, loading at the profile's copy bandwidths; the
    cost check starts from the profile's prefill rate at a full step."""
    if host_gb <= 0:
        return None
    block_bytes = profile.kv_bytes_per_token * profile.block_size
    spec = TierSpec(int(host_gb * 1e9) // block_bytes, int(disk_gb * 1e9) // block_bytes, block_bytes)
    rate = profile.max_num_batched_tokens / profile.prefill_s(profile.max_num_batched_tokens)
    return ModelledTiers(spec, profile.kv_host_gb_per_s * 1e9, profile.kv_disk_gb_per_s * 1e9, clock, time_factor, rate)


@dataclass(frozen=True, slots=True)
class Payload:
    """A real KV cache for the sim runner: bytes per token and its size (how it moves is the TransferConfig's)."""

    kv_bytes_per_token: int
    cache_bytes: int = 0  # 0: the profile's blocks, within DEFAULT_MAX_CACHE_BYTES


class SimRunner(MovedLoads):
    def __init__(
        self,
        profile: TimingProfile,
        time_factor: float = 1.0,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        sleep: Callable[[float], None] = time.sleep,
        kv_host_gb: float = 0.0,
        kv_disk_gb: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        load_time_factor: float | None = None,
        payload: Payload | None = None,
        vocab_size: int = VOCAB_SIZE,
        kv_transport: str = transports.STAGING,
    ):
        """`load_time_factor` scales an onboarding load's modelled time on `clock` (default `time_factor`; the
        cluster simulator, stepping in virtual time with time_factor 0, gives 1). `payload`: a real KV cache, moved
        by `kv_transport` (the engine's TransferConfig's)."""
        if time_factor < 0:
            raise ValueError(f"time_factor must be >= 0, got {time_factor}")
        self.profile, self.time_factor, self.sleep = profile, time_factor, sleep
        self.tiers = sim_tiers(
            profile, kv_host_gb, kv_disk_gb, clock, time_factor if load_time_factor is None else load_time_factor
        )
        self.cache = None
        if payload is None:
            layout = KvLayout(1, 1, 1, "float32", profile.block_size)  # NOTE: exports stay tiny
            self.info = RunnerInfo(layout, profile.num_blocks, max_model_len, vocab_size, no_logits="sim")
            return
        layout = payload_layout(payload.kv_bytes_per_token, profile.block_size)
        block_bytes = payload.kv_bytes_per_token * profile.block_size
        num_blocks = (
            max(1, payload.cache_bytes // block_bytes)
            if payload.cache_bytes
            else default_num_blocks(payload.kv_bytes_per_token, profile.block_size, profile.num_blocks)
        )
        self.cache = SimKvCache(layout, num_blocks, prefault=kv_transport == transports.NIXL)
        self.mover = (
            KvMover(self.cache, layout, kv_transport, verify=self.cache.check)
            if kv_transport in transports.LOADING
            else None
        )
        self.info = RunnerInfo(
            layout, num_blocks, max_model_len, vocab_size, kv_transport=kv_transport, no_logits="sim"
        )

    def step_duration(self, out: SchedulerOutput) -> float:
        num_decodes = sum(1 for s in out.scheduled if is_decode(s.num_new_tokens, s.start, s.seq))
        active = out.num_blocks_used / self.profile.num_blocks
        return self.profile.step_s(out.num_tokens - num_decodes, num_decodes, active)

    def launch(self, out: SchedulerOutput) -> _Timed:
        """Tokens at once; `wait` sleeps until the modelled step would have ended (never in virtual time)."""
        if self.cache is not None:
            for s in out.scheduled:
                end = s.start + s.num_new_tokens
                self.cache.stamp(s.seq.block_table, s.start, s.seq.token_ids[s.start : end])
        sampled = [(next_token(s.seq, self.info.vocab_size), None) for s in out.sampling]
        until = time.perf_counter() + self.step_duration(out) * self.time_factor if self.time_factor else 0.0
        return _Timed(sampled, until, self.sleep)

    def read_kv(self, block_ids: list[int], token_ids: tuple[int, ...]) -> KvExport:
        if self.cache is None:
            return zero_kv_export(self.info.kv_layout, len(block_ids), token_ids)
        data = self.cache.blocks[:, block_ids].tobytes()  # [planes, n, block_bytes]: the KvExport order
        return KvExport(self.info.kv_layout, token_ids, len(block_ids), data)

    def import_kv(self, block_ids: list[int], kv: KvExport) -> None:
        """The pull of a prefill worker's KV takes the profile's transfer time.

        NOTE: the engine loop waits it out, as a runner whose import is a blocking copy would."""
        if self.cache is not None:
            self.cache.write_blocks(
                block_ids, np.frombuffer(kv.data, np.uint8).reshape(self.cache.blocks.shape[0], kv.num_blocks, -1)
            )
            return
        if self.time_factor:
            self.sleep(self.profile.transfer_s(kv.num_tokens) * self.time_factor)


@dataclass(frozen=True, slots=True)
class SimSpec:
    """A sim engine's settings: its own knobs (profile, time factor, real KV cache) and the shared sub-configs."""

    sim: SimOptions = SimOptions()  # the profile (shipped name or JSON path; "" the default), time factor, payload
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    enable_prefix_caching: bool = True
    cache: CacheConfig = CacheConfig()  # its host and disk tier sizes: modelled tiers (no bytes), per worker
    # kv_transport: how a real KV cache moves (sim.kv_cache_mb > 0); held_kv_ttl_s: held KV no one took is let go
    transfer: TransferConfig = TransferConfig(transports.STAGING)
    model: str = ""  # a checkpoint directory whose vocabulary the tokens come from ("": VOCAB_SIZE)


def build_core(spec: SimSpec) -> EngineCore:
    profile = load_profile(spec.sim.profile) if spec.sim.profile else load_profile()
    payload = Payload(spec.sim.kv_bytes_per_token, spec.sim.kv_cache_mb << 20) if spec.sim.has_payload else None
    return sim_core(
        profile,
        spec.sim.time_factor,
        spec.max_model_len,
        spec.enable_prefix_caching,
        kv_host_gb=spec.cache.kv_host_gb,
        kv_disk_gb=spec.cache.kv_disk_gb,
        payload=payload,
        transfer=spec.transfer,
        vocab_size=model_vocab_size(spec.model),
    )


def sim_core(
    profile: TimingProfile,
    time_factor: float = 1.0,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    enable_prefix_caching: bool = True,
    clock: Callable[[], float] = time.monotonic,
    kv_host_gb: float = 0.0,
    kv_disk_gb: float = 0.0,
    load_time_factor: float | None = None,
    payload: Payload | None = None,
    transfer: TransferConfig = TransferConfig(transports.STAGING),
    vocab_size: int = VOCAB_SIZE,
) -> EngineCore:
    """An EngineCore over a SimRunner with the profile's scheduling limits."""
    batch = BatchConfig(
        profile.max_num_seqs, profile.max_num_batched_tokens, enable_prefix_caching=enable_prefix_caching
    )
    config = CoreConfig(batch, transfer)
    runner = SimRunner(
        profile,
        time_factor,
        max_model_len,
        kv_host_gb=kv_host_gb,
        kv_disk_gb=kv_disk_gb,
        clock=clock,
        load_time_factor=load_time_factor,
        payload=payload,
        vocab_size=vocab_size,
        kv_transport=transfer.kv_transport,
    )
    return EngineCore(config, runner, clock)
