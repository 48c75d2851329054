"""The draft-model proposer: a small checkpoint with the target's tokenizer, run by the same ModelRunner code over its
own small paged KV cache, proposes greedily (a point-mass draft, so the target's acceptance rule stays exact). Keeps
one mirror sequence per request; knows nothing of the target's blocks."""

import logging
from collections.abc import Sequence as Seq
from dataclasses import replace
from pathlib import Path

from engines.base.types import SamplingParams
from engines.core.block_manager import BlockManager
from engines.core.sequence import Sequence
from engines.core.step import ScheduledSeq, SchedulerOutput
from engines.native.config import EngineConfig, ModelConfig, SpeculativeOptions
from engines.native.model_runner import ModelRunner
from engines.transfer import transports

log = logging.getLogger(__name__)
_GREEDY = SamplingParams(max_tokens=1 << 30, ignore_eos=True)


class DraftError(ValueError):
    """A draft checkpoint that cannot propose for this target (another vocabulary or tokenizer)."""


def check_draft(target_dir: str, draft_dir: str) -> ModelConfig:
    """The draft's config, after checking it speaks the target's vocabulary: same size, same tokenizer.json."""
    target, draft = ModelConfig.from_dir(target_dir), ModelConfig.from_dir(draft_dir)
    if draft.vocab_size != target.vocab_size:
        raise DraftError(f"draft model {draft_dir} has {draft.vocab_size} token ids, the target {target.vocab_size}")
    paths = [Path(d) / "tokenizer.json" for d in (target_dir, draft_dir)]
    if all(p.is_file() for p in paths) and paths[0].read_bytes() != paths[1].read_bytes():
        raise DraftError(f"draft model {draft_dir} does not use the target's tokenizer (tokenizer.json differs)")
    return draft


class DraftProposer:
    def __init__(self, target: EngineConfig, draft_dir: str, num_blocks: int):
        model_cfg = check_draft(target.model, draft_dir)
        # NOTE: the draft's own small cache; no prefix caching (its blocks are rewritten as proposals are rejected)
        config = replace(
            target,
            model=draft_dir,
            batch=replace(target.batch, enable_prefix_caching=False),
            cache=replace(target.cache, num_blocks=num_blocks, kv_host_gb=0.0, kv_disk_dir="", kv_disk_gb=0.0),
            transfer=replace(target.transfer, kv_transport=transports.BYTES),
            speculation=SpeculativeOptions(),
        )
        self.runner = ModelRunner(config, model_cfg)
        self.runner.grammars = None  # NOTE: greedy proposals never follow a grammar (structured requests never ask)
        self.block_manager = BlockManager(num_blocks, config.cache.block_size, enable_prefix_caching=False)
        self.mirrors: dict[str, Sequence] = {}

    def relative_cost(self, target) -> float:
        """What one draft step costs, as a fraction of a target step: their parameter counts' ratio (a decode step
        at small batch reads every weight once)."""
        return _num_params(self.runner.model) / _num_params(target)

    def propose(self, req_id: str, token_ids: Seq[int], k: int) -> list[int]:
        """k greedy draft tokens after `token_ids`; fewer (or none) when the draft's cache or length runs out."""
        if len(token_ids) + k > self.runner.max_model_len:
            return []
        seq = self._synced(req_id, token_ids)
        proposed: list[int] = []
        for _ in range(k):
            num_new = seq.num_tokens - seq.num_computed_tokens
            if not self.block_manager.allocate_slots(seq, num_new):
                self.forget(req_id)  # NOTE: the cache is full: this request goes without proposals for now
                return proposed
            step = SchedulerOutput([ScheduledSeq(seq, num_new, seq.num_computed_tokens)])
            token = self.runner.launch(step).to_host()[0][0]
            seq.num_computed_tokens += num_new
            seq.token_ids.append(token)
            proposed.append(token)
        return proposed

    def forget(self, req_id: str) -> None:
        seq = self.mirrors.pop(req_id, None)
        if seq is not None:
            self.block_manager.free(seq)

    def _synced(self, req_id: str, token_ids: Seq[int]) -> Sequence:
        """The request's mirror with the target's tokens; its KV kept up to where they still agree (the draft's
        rejected proposals are rolled back)."""
        seq = self.mirrors.get(req_id)
        if seq is None:
            seq = self.mirrors[req_id] = Sequence(req_id, [], len(token_ids), _GREEDY)
        n = _common_prefix(seq.token_ids, token_ids)
        seq.token_ids = list(token_ids)
        if seq.num_computed_tokens > n:
            seq.num_computed_tokens = n
            self.block_manager.truncate(seq, self.block_manager.num_blocks_for(n))
        if seq.num_computed_tokens == seq.num_tokens:  # NOTE: one token at least is computed, to sample from
            seq.num_computed_tokens -= 1
        return seq


def _num_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _common_prefix(a: Seq[int], b: Seq[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
