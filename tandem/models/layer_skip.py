"""`tandem model layer-skip`: a self-drafting checkpoint for speculative decoding — a model's first N decoder layers
with its own embedding, final norm and LM head, so it speaks the target's tokenizer exactly. Copies tensors; never
trains or alters them (an early exit untrained for it: acceptance is whatever the truncated model agrees)."""

import json
import re
import shutil
from pathlib import Path

from tandem.models.errors import ModelError

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def kept(name: str, num_layers: int) -> bool:
    """True for a tensor of the first `num_layers` layers or outside the layer stack (embedding, norm, head)."""
    match = _LAYER.match(name)
    return match is None or int(match.group(1)) < num_layers


def layer_skip_checkpoint(src: Path, dst: Path, num_layers: int) -> Path:
    """Write `src`'s first `num_layers` layers (and everything outside the stack) as a checkpoint in `dst`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    config = _read_config(src)
    total = config.get("num_hidden_layers", 0)
    if not 1 <= num_layers < total:
        raise ModelError(f"--layers must be in [1, {total - 1}] for {src} ({total} layers), got {num_layers}")
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ModelError(f"no .safetensors files in {str(src)!r}")
    dst.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            tensors.update({name: f.get_tensor(name) for name in f.keys() if kept(name, num_layers)})
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = {**config, "num_hidden_layers": num_layers}
    if isinstance(config.get("layer_types"), list):  # NOTE: per-layer settings (newer configs) shrink with the stack
        config["layer_types"] = config["layer_types"][:num_layers]
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in _SIDE_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    return dst


def _read_config(src: Path) -> dict:
    if not (src / "config.json").is_file():
        raise ModelError(f"no config.json in {str(src)!r}: not a checkpoint directory")
    return json.loads((src / "config.json").read_text())
