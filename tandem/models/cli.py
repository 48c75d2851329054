"""`tandem model fetch|init|quantize|calibrate|layer-skip`: argument parsing and printing only; the work is in
fetch.py, init.py, layer_skip.py and the engine's quant package.

Progress goes to stderr; the model directory is the last line of stdout, so scripts can `tail -n1`.
"""

import argparse
import json
from pathlib import Path

from tandem.models import configs
from tandem.models.errors import ModelError


def add_model_commands(subparsers: argparse._SubParsersAction) -> None:
    model = subparsers.add_parser("model", help="fetch or create model checkpoints")
    actions = model.add_subparsers(dest="model_command", required=True)

    fetch = actions.add_parser("fetch", help="download (or convert offline) a model; prints its directory")
    fetch.add_argument("model_id", nargs="?", default=None, help="hub id, local directory or .gguf file")
    fetch.add_argument("--cache-dir", type=Path, default=None, help="default: $TANDEM_CACHE_DIR/models")
    fetch.add_argument(
        "--link",
        type=Path,
        default=None,
        help="also point this symlink at the directory (a container's fixed model path)",
    )
    fetch.set_defaults(func=_run_fetch)

    init = actions.add_parser("init", help="write a random-weight checkpoint; prints its directory")
    init.add_argument("dir", type=Path)
    init.add_argument("--arch", required=True, choices=sorted(configs.ARCHS))
    init.add_argument("--tiny", action="store_true", default=True, help="the tiny test shape (default)")
    init.add_argument("--shape", choices=sorted(configs.SHAPES), default=None, help="a named shape; wins over --tiny")
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    init.add_argument("--config-only", action="store_true", help="write config and tokenizer, no weights")
    init.add_argument("--device", default="cpu", help="draw the random weights there (cuda is faster for 8B shapes)")
    init.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config.json override; VALUE is parsed as JSON when it can be (repeatable)",
    )
    init.set_defaults(func=_run_init)

    quantize = actions.add_parser("quantize", help="write an FP8 or NVFP4 copy of a checkpoint; prints its directory")
    quantize.add_argument("src", type=Path, help="checkpoint directory (config.json + safetensors)")
    quantize.add_argument("dst", type=Path, help="where the quantized copy goes")
    quantize.add_argument(
        "--format",
        required=True,
        choices=["fp8", "nvfp4"],
        help="fp8: E4M3 weights, one scale per output channel; nvfp4: E2M1 in 16-blocks",
    )
    quantize.add_argument("--device", default="cpu", help="where to quantize (cuda is faster for 8B shapes)")
    quantize.set_defaults(func=_run_quantize)

    skip = actions.add_parser(
        "layer-skip",
        help="write a model's first N layers (+ norm, LM head) as a draft "
        "for speculative decoding; prints its directory",
    )
    skip.add_argument("src", type=Path, help="checkpoint directory (config.json + safetensors)")
    skip.add_argument("dst", type=Path, help="where the draft goes")
    skip.add_argument("--layers", type=int, required=True, help="decoder layers kept, from the first")
    skip.set_defaults(func=_run_layer_skip)

    calibrate = actions.add_parser(
        "calibrate", help="measure static FP8 scales (KV cache, activations) into tandem_quant.json; prints it"
    )
    calibrate.add_argument("dir", type=Path, help="checkpoint directory (quantized or not)")
    calibrate.add_argument(
        "--prompts", type=Path, default=None, help="text file, one prompt per line (default: the built-in corpus)"
    )
    calibrate.add_argument("--num-prompts", type=int, default=64, help="use at most this many prompts")
    calibrate.add_argument("--device", default="cpu", help="where to run the model (cuda for 8B shapes)")
    calibrate.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    calibrate.set_defaults(func=_run_calibrate)


def parse_override(item: str) -> tuple[str, object]:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ModelError(f"--set expects KEY=VALUE, got {item!r}")
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw  # a bare string, e.g. --set hidden_act=gelu


def _run_fetch(args: argparse.Namespace) -> int:
    from tandem.models.fetch import DEFAULT_MODEL_ID, fetch_model, link_model  # lazy: pulls in torch and gguf

    model_dir = fetch_model(args.model_id or DEFAULT_MODEL_ID, cache_dir=args.cache_dir)
    if args.link is not None:
        link_model(model_dir, args.link)
    print(model_dir)
    return 0


def _run_init(args: argparse.Namespace) -> int:
    from tandem.models.init import init_model  # lazy: pulls in torch

    overrides = dict(parse_override(item) for item in args.overrides)
    out = init_model(
        args.dir,
        args.arch,
        tiny=args.tiny,
        shape=args.shape,
        seed=args.seed,
        dtype=args.dtype,
        overrides=overrides,
        config_only=args.config_only,
        device=args.device,
    )
    print(out)
    return 0


def _run_quantize(args: argparse.Namespace) -> int:
    from engines.native.quant.transform import quantize_checkpoint  # lazy: pulls in torch

    if not (args.src / "config.json").is_file():
        raise ModelError(f"no config.json in {str(args.src)!r}: not a checkpoint directory")
    print(quantize_checkpoint(args.src, args.dst, args.format, args.device))
    return 0


def _run_layer_skip(args: argparse.Namespace) -> int:
    from tandem.models.layer_skip import layer_skip_checkpoint  # lazy: pulls in torch

    print(layer_skip_checkpoint(args.src, args.dst, args.layers))
    return 0


def _run_calibrate(args: argparse.Namespace) -> int:
    from engines.native.quant.calibrate import calibrate_checkpoint  # lazy: pulls in torch

    if not (args.dir / "tokenizer.json").is_file():
        raise ModelError(f"no tokenizer.json in {str(args.dir)!r}: calibration tokenizes its prompts")
    if args.num_prompts < 1:
        raise ModelError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    print(
        calibrate_checkpoint(
            args.dir, calibration_ids(args.dir, args.prompts, args.num_prompts), args.device, args.dtype
        )
    )
    return 0


def calibration_ids(model_dir: Path, prompts_file: Path | None, limit: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    from tandem.models.corpus import CORPUS

    if prompts_file is not None and not prompts_file.is_file():
        raise ModelError(f"--prompts {str(prompts_file)!r} is not a file")
    texts = [t for t in prompts_file.read_text().splitlines() if t.strip()] if prompts_file else list(CORPUS)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = [tok.encode(t, add_special_tokens=False).ids for t in texts[:limit]]
    ids = [i for i in ids if i]
    if not ids:
        raise ModelError("no calibration prompt has any token")
    return ids
