"""The zero runner: no model, every step free. A benchmark through gateway -> router -> workers over it
measures the services and the engine core alone. Tokens are a deterministic walk over the vocabulary that
never produces EOS (it has none); KV exports carry one tiny block per block of tokens. No torch."""

import json
from dataclasses import dataclass
from pathlib import Path

from engines.base.engine_configs import BatchConfig, CacheConfig
from engines.base.requests import DTYPE_BYTES
from engines.base.types import KvExport, KvLayout
from engines.core.engine_core import CoreConfig, EngineCore
from engines.core.runner import Done, RunnerInfo, deterministic_token, zero_kv_export
from engines.core.sequence import Sequence
from engines.core.step import SchedulerOutput
from engines.core.tiers.kv_tiers import TieredLoads, TierSpec
from engines.core.tiers.modelled_tiers import ModelledTiers

DEFAULT_VOCAB_SIZE = 32000
DEFAULT_NUM_BLOCKS = 1 << 15  # 512k tokens at 16 per block: room for any benchmark's concurrency
MAX_DEFAULT_MODEL_LEN = 8192  # as the native runner caps a checkpoint's context


class ZeroRunner(TieredLoads):
    def __init__(
        self,
        vocab_size: int,
        block_size: int = 16,
        max_model_len: int = 8192,
        num_blocks: int = DEFAULT_NUM_BLOCKS,
        kv_host_gb: float = 0.0,
        kv_disk_gb: float = 0.0,
    ):
        """With `kv_host_gb`, modelled tiers whose loads end at the next poll (the control plane's cost alone)."""
        layout = KvLayout(1, 1, 1, "float32", block_size)
        self.info = RunnerInfo(layout, num_blocks, max_model_len, vocab_size, no_logits="zero")
        block_bytes = 2 * block_size * DTYPE_BYTES[layout.dtype]
        self.tiers = (
            ModelledTiers(
                TierSpec(int(kv_host_gb * 1e9) // block_bytes, int(kv_disk_gb * 1e9) // block_bytes, block_bytes)
            )
            if kv_host_gb > 0
            else None
        )

    def next_token(self, seq: Sequence) -> int:
        candidate = (seq.token_ids[seq.num_prompt_tokens - 1] + 1 + seq.num_output_tokens) % self.info.vocab_size
        return deterministic_token(candidate, seq.banned_token_ids(), self.info.vocab_size)

    def launch(self, out: SchedulerOutput) -> Done:
        return Done([(self.next_token(s.seq), None) for s in out.sampling])

    def step_duration(self, out: SchedulerOutput) -> float:
        return 0.0

    def read_kv(self, block_ids: list[int], token_ids: tuple[int, ...]) -> KvExport:
        return zero_kv_export(self.info.kv_layout, len(block_ids), token_ids)

    def import_kv(self, block_ids: list[int], kv: KvExport) -> None:
        pass


@dataclass(frozen=True, slots=True)
class ZeroSpec:
    model: str  # a checkpoint directory: only config.json's vocab and context are read (defaults without one)
    batch: BatchConfig = BatchConfig(max_num_seqs=256, max_num_batched_tokens=8192)  # max_model_len 0: config.json's
    cache: CacheConfig = CacheConfig()  # num_blocks 0: DEFAULT_NUM_BLOCKS; the tiers' sizes only (no disk is written)


def build_core(spec: ZeroSpec) -> EngineCore:
    path = Path(spec.model) / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    vocab_size = config.get("vocab_size", DEFAULT_VOCAB_SIZE)
    batch, cache = spec.batch, spec.cache
    max_model_len = batch.max_model_len or min(
        config.get("max_position_embeddings", MAX_DEFAULT_MODEL_LEN), MAX_DEFAULT_MODEL_LEN
    )
    runner = ZeroRunner(
        vocab_size,
        cache.block_size,
        max_model_len,
        cache.num_blocks or DEFAULT_NUM_BLOCKS,
        cache.kv_host_gb,
        cache.kv_disk_gb,
    )
    return EngineCore(CoreConfig(batch), runner)
