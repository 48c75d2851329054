"""What verifying k proposed tokens costs on this device, measured once at start: a decode step against steps that
verify 1..k tokens, in scratch blocks before any request arrives. Speculative decoding's adaptive rule reads it; the
rule itself stays pure (engines/core/speculative.py). Must not run once requests hold blocks."""
import logging
import time

from engines.base.types import SamplingParams
from engines.core.scheduler import ScheduledSeq, SchedulerOutput
from engines.core.sequence import Sequence

log = logging.getLogger(__name__)
CONTEXT = 128  # tokens of context the timed steps attend to (a short chat turn)
_TOKEN = 17  # any id of every vocabulary: the cost does not depend on the values


def measure_verify_costs(model_runner, max_k: int, repeats: int = 5) -> tuple[float, ...]:
    """(cost of verifying 1 token, ..., k tokens), each as the extra fraction of a decode step's time: the fastest of
    `repeats` alternated runs of each (the fastest: a busy neighbour only ever adds time)."""
    seq = _scratch_seq(model_runner, CONTEXT + max_k + 1)
    model_runner.launch(SchedulerOutput([ScheduledSeq(seq, CONTEXT, 0)])).to_host()  # fills the context's KV
    best = [float("inf")] * (max_k + 1)
    for _ in range(repeats):
        for k in range(max_k + 1):
            step = SchedulerOutput([ScheduledSeq(seq, 1 + k, CONTEXT - 1, (_TOKEN,) * k)])
            start = time.perf_counter()
            model_runner.launch(step).to_host()
            best[k] = min(best[k], time.perf_counter() - start)
    costs = tuple(max(0.0, t / best[0] - 1.0) for t in best[1:])
    log.info("speculative decoding: verifying 1..%d tokens costs %s of a decode step (%.1f ms)", max_k,
             ", ".join(f"{c:.2f}" for c in costs), best[0] * 1e3)
    return costs


def _scratch_seq(model_runner, num_tokens: int) -> Sequence:
    """A sequence over the cache's first blocks (free at start: nothing has been admitted yet)."""
    num_blocks = -(-num_tokens // model_runner.block_size)
    if num_blocks > model_runner.num_blocks:
        raise ValueError(f"measuring verification needs {num_blocks} KV blocks, "
                         f"the cache has {model_runner.num_blocks}")
    seq = Sequence("__spec_costs__", [_TOKEN] * CONTEXT, CONTEXT, SamplingParams(max_tokens=1, ignore_eos=True))
    seq.block_table = list(range(num_blocks))
    return seq
