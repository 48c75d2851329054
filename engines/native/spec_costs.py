"""What verifying k proposed tokens costs on this device, measured once at start: a decode step against steps that
verify 1..k tokens, greedy and sampled, in scratch blocks before any request arrives. Speculative decoding's adaptive rule reads it; the
rule itself stays pure (engines/core/speculative.py). Must not run once requests hold blocks."""

import logging
import time

from engines.base.block_hash import num_blocks_for
from engines.base.types import SamplingParams
from engines.core.sequence import Sequence
from engines.core.step import ScheduledSeq, SchedulerOutput

log = logging.getLogger(__name__)
CONTEXT = 128  # tokens of context the timed steps attend to (a short chat turn)
_TOKEN = 17  # any id of every vocabulary: the cost does not depend on the values


# a sampled row (temperature, top-p) costs more than a greedy one, and a verified sampled request samples each row
KINDS = {
    "greedy": SamplingParams(max_tokens=1, ignore_eos=True),
    "sampled": SamplingParams(max_tokens=1, ignore_eos=True, temperature=1.0, top_p=0.95, seed=0),
}


def measure_verify_costs(model_runner, max_k: int, repeats: int = 5) -> dict[str, tuple[float, ...]]:
    """Per kind of request (greedy, sampled): (cost of verifying 1 token, ..., k tokens), each as the extra fraction
    of that kind's decode step: the fastest of `repeats` alternated runs of each (a busy neighbour only adds time)."""
    seq = _scratch_seq(model_runner, CONTEXT + max_k + 1)
    model_runner.launch(SchedulerOutput([ScheduledSeq(seq, CONTEXT, 0)])).to_host()  # fills the context's KV
    costs = {}
    for kind, params in KINDS.items():
        seq.params = params
        best = [float("inf")] * (max_k + 1)
        for _ in range(repeats):
            for k in range(max_k + 1):
                step = SchedulerOutput([ScheduledSeq(seq, 1 + k, CONTEXT - 1, (_TOKEN,) * k)])
                start = time.perf_counter()
                model_runner.launch(step).to_host()
                best[k] = min(best[k], time.perf_counter() - start)
        costs[kind] = tuple(max(0.0, t / best[0] - 1.0) for t in best[1:])
        log.info(
            "speculative decoding, %s: verifying 1..%d tokens costs %s of a decode step (%.1f ms)",
            kind,
            max_k,
            ", ".join(f"{c:.2f}" for c in costs[kind]),
            best[0] * 1e3,
        )
    return costs


def _scratch_seq(model_runner, num_tokens: int) -> Sequence:
    """A sequence over the cache's first blocks (free at start: nothing has been admitted yet)."""
    num_blocks = num_blocks_for(num_tokens, model_runner.block_size)
    if num_blocks > model_runner.num_blocks:
        raise ValueError(
            f"measuring verification needs {num_blocks} KV blocks, the cache has {model_runner.num_blocks}"
        )
    seq = Sequence("__spec_costs__", [_TOKEN] * CONTEXT, CONTEXT, KINDS["greedy"])
    seq.block_table = list(range(num_blocks))
    return seq
