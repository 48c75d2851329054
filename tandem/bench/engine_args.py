"""`tandem bench engine`'s arguments (shared by its speculative and profile variants) and the model they name. A leaf:
it imports no benchmark, so the `tandem` command parses without loading torch."""

import argparse
import os
from pathlib import Path

ENGINE_NAMES = ("native", "transformers")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, help="checkpoint directory (default: SmolLM2)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument(
        "--threads", type=int, default=all_cores(), help="torch threads for both engines (default: all cores)"
    )
    parser.add_argument("--num-requests", type=int, default=32, help="concurrent requests")
    parser.add_argument("--isl", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--osl", type=int, default=128, help="output tokens per request")
    parser.add_argument(
        "--engines", default=",".join(ENGINE_NAMES), help="comma-separated subset of " + ",".join(ENGINE_NAMES)
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--speculative",
        default=None,
        metavar="ngram|draft:DIR",
        help="instead: speculative decoding against the same engine without it (copy-heavy and "
        "chat workloads, batch 1 and 32 concurrent; transformers' prompt lookup at batch 1)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="--speculative: alternated pairs of runs (medians)")
    parser.add_argument(
        "--spec-workloads",
        default="copy,chat,chat32,sampled,sampled32",
        help="--speculative: which workloads (copy, chat, chat32, sampled, sampled32)",
    )


def all_cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)  # Linux: the cores this process may use
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def resolve_model(model: Path | None) -> Path:
    """The checkpoint a benchmark runs: the one named, else the default model (fetched once, cached)."""
    if model is not None:
        return model
    try:
        from tandem.models.fetch import fetch_model
    except ImportError as exc:
        raise SystemExit("no default model available here; pass --model DIR") from exc
    return Path(fetch_model())
