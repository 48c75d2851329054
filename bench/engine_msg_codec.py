"""Encode + decode cost of the engine-process messages (engines/core/messages.py), per message, with timeit.

Imports the codec from whatever `engines` is first on sys.path, so the same script times two trees in one run:
`--anchor DIR` times a checkout's codec (the anchor) in a child process, then this tree's, and prints both.
"""

import argparse
import json
import os
import subprocess
import sys
import timeit
from pathlib import Path


def _messages():
    from engines.base.events import KvEvent, KvEventKind
    from engines.base.types import EngineRequest, EngineStats, FinishReason, RequestOutput, SamplingParams, TokenLogprob
    from engines.core.messages import Add, StepOutputs

    params = SamplingParams(
        max_tokens=256,
        temperature=0.7,
        top_p=0.9,
        seed=7,
        stop_token_ids=(2,),
        logprobs=True,
        top_logprobs=2,
        logit_bias=((5, 1.0),),
        cache_salt="t",
    )
    add = Add(EngineRequest("req-1", tuple(range(512)), params, hash_root=1))
    stats = EngineStats(3, 32, 0, 4096, 1200, 10, 16, 8192, 999, 500, 0, 123456, 654321)
    plain = [RequestOutput(f"req-{i}", (1000 + i,), num_prompt_tokens=512) for i in range(32)]
    lps = [
        RequestOutput(
            f"req-{i}",
            (1000 + i,),
            (TokenLogprob(1000 + i, -0.5, ((1000 + i, -0.5), (7, -1.5))),),
            num_prompt_tokens=512,
        )
        for i in range(32)
    ]
    done = [
        RequestOutput(
            f"req-{i}",
            (1000 + i,),
            finish_reason=FinishReason.STOP,
            num_prompt_tokens=512,
            num_cached_tokens=256,
            queue_s=0.01,
        )
        for i in range(32)
    ]
    events = [KvEvent(1, KvEventKind.STORED, 0, tuple(range(2**63, 2**63 + 32)))]
    return {
        "add_512_tokens": add,
        "step_32_tokens": StepOutputs(plain, stats),
        "step_32_logprobs": StepOutputs(lps, stats),
        "step_32_finished_events": StepOutputs(done, stats, events),
    }


def measure(number: int) -> dict[str, float]:
    """Microseconds per encode + decode of each message, the best of 5 repeats."""
    from engines.core.messages import decode, encode

    out = {}
    for name, message in _messages().items():
        assert decode(encode(message)) == message, name
        best = min(timeit.repeat(lambda m=message: decode(encode(m)), number=number, repeat=5))
        out[name] = round(best / number * 1e6, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--number", type=int, default=2000)
    ap.add_argument("--anchor", help="a checkout whose codec is the anchor")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.number)))
        return
    runs = {}
    for label, root in (("anchor", args.anchor), ("this", str(Path(__file__).resolve().parents[1]))):
        if root:
            env = dict(os.environ, PYTHONPATH=root)
            cmd = [sys.executable, __file__, "--child", "--number", str(args.number)]
            runs[label] = json.loads(
                subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=root).stdout
            )
    print(f"{'message':28} " + " ".join(f"{k + ' us':>12}" for k in runs) + ("   ratio" if len(runs) == 2 else ""))
    for name in runs["this"]:
        row = " ".join(f"{runs[k][name]:12.2f}" for k in runs)
        ratio = f"   {runs['this'][name] / runs['anchor'][name]:.2f}" if "anchor" in runs else ""
        print(f"{name:28} {row}{ratio}")
    if args.json:
        Path(args.json).write_text(json.dumps({"number": args.number, "us_per_message": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
