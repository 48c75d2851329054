"""The native (PyTorch) runner: EngineCore's Runner over a ModelRunner, and the builders an engine process
calls. Builds the model where it is called (the engine process or thread)."""

from dataclasses import dataclass, replace

import torch

from engines.base.errors import InvalidRequestError
from engines.base.types import KvExport, SamplingParams
from engines.core.engine_core import CoreConfig, EngineCore
from engines.core.runner import RunnerInfo
from engines.core.sequence import Sequence
from engines.core.step import Sampled, ScheduledSeq, SchedulerOutput
from engines.core.tiers.kv_tiers import TierSpec
from engines.native.config import EngineConfig, ModelConfig
from engines.native.draft import DraftProposer
from engines.native.kv_cache import KvCache, bytes_per_block
from engines.native.kv_transfer import make_mover
from engines.native.model_runner import ModelRunner
from engines.native.sampler import SampledTokens
from engines.native.spec_costs import measure_verify_costs
from engines.native.tiers.host_pool import GB, check_host_budget, memory_available
from engines.native.tiers.native_tiers import NativeTiers, model_fingerprint
from engines.transfer import transports
from engines.transfer.mover import MovedLoads


@dataclass(slots=True)
class _Pending:
    sampled: SampledTokens | None

    def wait(self) -> list[Sampled]:
        return self.sampled.to_host() if self.sampled is not None else []


class NativeRunner(MovedLoads):
    def __init__(self, config: EngineConfig):
        model_cfg = ModelConfig.from_dir(config.model)
        if config.cache.kv_host_gb:  # NOTE: before the model loads: a budget the machine cannot hold fails at once
            check_host_budget(int(config.cache.kv_host_gb * GB), memory_available())
        self.model_runner = ModelRunner(config, model_cfg)
        self.mover = make_mover(self.model_runner.kv_cache, config.transfer.kv_transport)
        self.info = RunnerInfo(
            self.model_runner.kv_layout,
            self.model_runner.num_blocks,
            self.model_runner.max_model_len,
            model_cfg.vocab_size,
            model_cfg.eos_token_ids,
            kv_transport=config.transfer.kv_transport if self.mover else transports.BYTES,
            can_constrain=self.model_runner.grammars is not None,
            can_speculate=True,
        )
        self.tiers = make_tiers(config, self.model_runner.kv_cache) if config.cache.kv_host_gb else None

    @property
    def model(self):
        return self.model_runner.model

    @property
    def kv_cache(self):
        return self.model_runner.kv_cache

    def grammar_stats(self) -> dict:
        """EngineStats' grammar fields (all 0 when no request was constrained)."""
        grammars = self.model_runner.grammars
        if grammars is None:
            return {}
        c = grammars.counters
        return {
            "num_grammar_masks": c.num_masks,
            "grammar_mask_seconds": c.mask_seconds + c.build_seconds,
            "grammar_wait_seconds": c.wait_seconds,
        }

    def launch(self, out: SchedulerOutput) -> _Pending:
        return _Pending(self.model_runner.launch(out))

    def step_duration(self, out: SchedulerOutput) -> float:
        return 0.0  # NOTE: measured, not modelled: its time is the wall clock's

    def read_kv(self, block_ids: list[int], token_ids: tuple[int, ...]) -> KvExport:
        return self.model_runner.kv_cache.export(block_ids, token_ids)

    def import_kv(self, block_ids: list[int], kv: KvExport) -> None:
        self.model_runner.kv_cache.import_(block_ids, kv)


def make_tiers(config: EngineConfig, kv_cache: KvCache) -> NativeTiers:
    """The host (and disk) tiers under `kv_cache`, sized in whole blocks of every layer."""
    block_bytes = bytes_per_block(kv_cache.layout)
    spec = TierSpec(
        num_host_blocks=int(config.cache.kv_host_gb * GB) // block_bytes,
        num_disk_blocks=int(config.cache.kv_disk_gb * GB) // block_bytes,
        block_bytes=block_bytes,
    )
    return NativeTiers(kv_cache, spec, config.cache.kv_disk_dir, model_fingerprint(config.model), config.kv_disk_key)


def core_config(config: EngineConfig) -> CoreConfig:
    return CoreConfig(config.batch, config.transfer, config.speculation.spec_config())


def build_core(config: EngineConfig) -> EngineCore:
    """What the engine process (or thread) calls: the model, its KV cache and the core over them (and a draft
    model's, for speculative decoding with one)."""
    runner = NativeRunner(config)
    opts, core = config.speculation, core_config(config)
    if not opts.method:
        return EngineCore(core, runner)
    costs = {"greedy": opts.spec_verify_costs, "sampled": opts.spec_verify_costs}
    if opts.spec_verify_costs is None:  # NOTE: before any request: the timed steps use the cache's first blocks
        costs = measure_verify_costs(runner.model_runner, opts.num_speculative_tokens)
    spec = replace(core.spec, verify_costs=costs["greedy"], verify_costs_sampled=costs["sampled"])
    if opts.method != "draft":
        return EngineCore(replace(core, spec=spec), runner)
    # NOTE: as many blocks as the target's pool: a smaller draft model's blocks are smaller
    proposer = DraftProposer(config, opts.draft_dir, runner.info.num_blocks)
    # NOTE: each proposed token also costs a draft step: the adaptive rule weighs it (a draft too slow for its
    # acceptance rate switches itself off)
    spec = replace(spec, propose_cost=proposer.relative_cost(runner.model))
    return EngineCore(replace(core, spec=spec), runner, proposer=proposer)


def prompt_logits(core: EngineCore, token_ids: list[int]) -> torch.Tensor:
    """Next-token logits at every prompt position ([len, vocab] float32), for evaluation.

    Computed in scratch blocks, outside the request lifecycle; call between steps only.
    """
    seq = Sequence("__score__", list(token_ids), len(token_ids), SamplingParams(max_tokens=1))
    if not core.block_manager.allocate_slots(seq, len(token_ids)):
        raise InvalidRequestError("not enough free KV blocks to score this prompt")
    try:
        return core.runner.model_runner.prompt_logits(ScheduledSeq(seq, len(token_ids), 0))
    finally:
        core.block_manager.free(seq)
