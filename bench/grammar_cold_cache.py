"""Why a grammar mask costs more inside the engine than in a loop: the same matcher's per-token fill on the step
thread, with hot caches (nothing between steps) and with cold ones (256 MB streamed between steps, as a CPU forward
pass streams the weights). A diagnostic for bench/RESULTS.md; prints medians in µs.

  python bench/grammar_cold_cache.py [--model DIR]
"""

import json
import statistics
import sys
import time

import torch

from engines.base.structured import StructuredSpec
from engines.base.types import SamplingParams
from engines.core.sequence import Sequence
from engines.native.grammar import Grammars
from tandem.bench.structured_bench import story_schema


def model_dir() -> str:
    if "--model" in sys.argv:
        return sys.argv[sys.argv.index("--model") + 1]
    from tandem.models.fetch import fetch_model

    return str(fetch_model())


def main() -> None:
    torch.set_num_threads(1)
    g = Grammars.maybe_load(model_dir(), 49152, (2,))
    spec = StructuredSpec("json_schema", json.dumps(story_schema(64)))
    tokens = g.tokenizer.tokenize_str('{"story": "' + "once upon a time there was a lighthouse keeper who " * 20)
    big = torch.randn(64 * 1024 * 1024)  # 256 MB: a forward pass's worth of streaming through the caches
    for cold in (False, True, False, True):
        seq = Sequence(
            f"r{cold}{time.time()}", list(range(100, 228)), 128, SamplingParams(max_tokens=64, structured=spec)
        )
        fills = []
        for t_i in range(48):
            job = g.start([seq])
            if cold:
                big.sum()
            start = time.perf_counter()
            job.wait()
            fills.append(time.perf_counter() - start)
            seq.token_ids.append(tokens[t_i])
        seq.finish_reason = "length"
        print("cold" if cold else "hot ", "fill median us %.1f" % (1e6 * statistics.median(fills[1:])))


if __name__ == "__main__":
    main()
