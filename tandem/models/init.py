"""Write random-weight checkpoints (config, safetensors, tokenizer) in Hugging Face format, for tests and benches.

Weights are scaled so greedy decoding has clear top-1 margins; big shapes are written one layer per shard.
"""

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from tandem.models import configs, hf_files, toy_tokenizer
from tandem.models.errors import ModelError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# above this many bytes of weights, write one shard per layer instead of one file
MAX_SINGLE_FILE_BYTES = 2 * 1024**3
# NOTE: std 0.02 everywhere gives near-flat logits, and then two correct implementations can disagree on
# argmax through float noise. These scales give unit-variance projections (1/sqrt(fan_in)) and logits
# with std ~4, so top-1 margins are clear; norms are random so a norm that fails to load shows.
EMBED_STD = 0.25
LOGIT_STD = 4.0
BIAS_STD = 0.1
NORM_JITTER = 0.1


@dataclass(frozen=True, slots=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    kind: str  # "embed" | "lm_head" | "linear" | "bias" | "norm"


def init_model(
    out_dir: Path,
    arch: str,
    *,
    tiny: bool = True,
    shape: str | None = None,
    seed: int = 0,
    dtype: str = "float32",
    overrides: dict | None = None,
    config_only: bool = False,
    device: str = "cpu",
) -> Path:
    """Write a random checkpoint into `out_dir` (absent, empty, or a previous tandem checkpoint) and return it.

    `shape` names an entry of configs.SHAPES and wins over `tiny`; `overrides` are merged into config.json
    last and the weights follow the final config. `config_only` skips the weights (for huge shapes). `device`
    draws the random numbers there (cuda makes an 8B checkpoint in seconds; the values differ from cpu's).
    """
    if dtype not in DTYPES:
        raise ModelError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if shape is None and not tiny:
        raise ModelError(f"pass shape=NAME (known: {sorted(configs.SHAPES)}) or tiny=True")
    tok = toy_tokenizer.train_tokenizer()
    ids = toy_tokenizer.special_ids(tok)
    config = configs.build_config(
        arch,
        configs.get_shape(shape or "tiny"),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        bos_token_id=ids[toy_tokenizer.ENDOFTEXT],
        eos_token_id=ids[toy_tokenizer.IM_END],
        dtype=dtype,
        overrides=overrides,
    )
    tok = toy_tokenizer.pad_vocab(tok, config["vocab_size"])
    marker = {"arch": arch, "shape": shape or "tiny", "seed": seed, "config_only": config_only}
    with hf_files.staged_dir(Path(out_dir), marker, replace=True) as staging:
        hf_files.write_json(staging / "config.json", config)
        hf_files.write_json(staging / "generation_config.json", _generation_config(ids))
        toy_tokenizer.write_tokenizer(staging, tok, config["max_position_embeddings"])
        if not config_only:
            write_weights(staging, config, seed, DTYPES[dtype], device)
    return Path(out_dir)


def _generation_config(ids: dict[str, int]) -> dict:
    end, im_end = ids[toy_tokenizer.ENDOFTEXT], ids[toy_tokenizer.IM_END]
    return {"bos_token_id": end, "eos_token_id": [im_end, end], "pad_token_id": end}


def param_groups(config: dict) -> list[list[ParamSpec]]:
    """Parameters in write order: the embedding, one group per layer, then the final norm and lm_head."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    head = [ParamSpec("model.norm.weight", (hidden,), "norm")]
    if not config.get("tie_word_embeddings", False):
        head.append(ParamSpec("lm_head.weight", (vocab, hidden), "lm_head"))
    layers = [layer_specs(config, i) for i in range(config["num_hidden_layers"])]
    return [[ParamSpec("model.embed_tokens.weight", (vocab, hidden), "embed")], *layers, head]


def layer_specs(config: dict, layer: int) -> list[ParamSpec]:
    hidden, inter, dim = config["hidden_size"], config["intermediate_size"], configs.head_dim(config)
    q_out, kv_out = config["num_attention_heads"] * dim, config["num_key_value_heads"] * dim
    p = f"model.layers.{layer}"
    specs = [ParamSpec(f"{p}.input_layernorm.weight", (hidden,), "norm")]
    for proj, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
        specs.append(ParamSpec(f"{p}.self_attn.{proj}.weight", (out, hidden), "linear"))
        if configs.has_qkv_bias(config):
            specs.append(ParamSpec(f"{p}.self_attn.{proj}.bias", (out,), "bias"))
    specs.append(ParamSpec(f"{p}.self_attn.o_proj.weight", (hidden, q_out), "linear"))
    if configs.has_o_bias(config):
        specs.append(ParamSpec(f"{p}.self_attn.o_proj.bias", (hidden,), "bias"))
    if configs.has_qk_norm(config):
        specs += [ParamSpec(f"{p}.self_attn.{n}.weight", (dim,), "norm") for n in ("q_norm", "k_norm")]
    specs.append(ParamSpec(f"{p}.post_attention_layernorm.weight", (hidden,), "norm"))
    for proj, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)), ("down_proj", (hidden, inter))):
        specs.append(ParamSpec(f"{p}.mlp.{proj}.weight", shape, "linear"))
        if config.get("mlp_bias", False):
            specs.append(ParamSpec(f"{p}.mlp.{proj}.bias", (shape[0],), "bias"))
    return specs


def random_tensor(spec: ParamSpec, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    noise = torch.randn(spec.shape, generator=gen, dtype=torch.float32, device=gen.device)
    if spec.kind == "norm":
        return (1.0 + NORM_JITTER * noise).to(dtype)
    std = {
        "embed": EMBED_STD,
        "lm_head": LOGIT_STD / math.sqrt(spec.shape[-1]),  # final hidden state is RMS-normed to ~1 per element
        "linear": 1.0 / math.sqrt(spec.shape[-1]),
        "bias": BIAS_STD,
    }[spec.kind]
    return (noise * std).to(dtype)


def _host(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.cpu() for name, t in tensors.items()}


def write_weights(out_dir: Path, config: dict, seed: int, dtype: torch.dtype, device: str = "cpu") -> None:
    """One model.safetensors, or one shard per group plus the index when the weights are large."""
    gen = torch.Generator(device).manual_seed(seed)
    groups = param_groups(config)
    num_bytes = sum(math.prod(s.shape) for g in groups for s in g) * dtype.itemsize
    if num_bytes <= MAX_SINGLE_FILE_BYTES:
        tensors = _host({s.name: random_tensor(s, gen, dtype) for g in groups for s in g})
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map: dict[str, str] = {}
    for i, group in enumerate(groups):
        # NOTE: one group in memory at a time, so an 8B checkpoint needs ~2 GB of RAM, not 16
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = _host({s.name: random_tensor(s, gen, dtype) for s in group})
        save_file(tensors, str(out_dir / name), metadata={"format": "pt"})
        weight_map.update({s.name: name for s in group})
    index = {"metadata": {"total_size": num_bytes}, "weight_map": weight_map}
    hf_files.write_json(out_dir / "model.safetensors.index.json", index)
