"""config.json dicts in each architecture's Hugging Face format, and the named shapes `tandem model init` builds.

Pure data: no torch, no files.
"""

from dataclasses import dataclass

from tandem.models.errors import ModelError

LLAMA3_ROPE_8B = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@dataclass(frozen=True, slots=True)
class Shape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    vocab_size: int | None = None  # None: exactly the tokenizer's size
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-6


SHAPES = {
    "tiny": Shape(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=512,
    ),
    "llama-3.1-8b": Shape(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        max_position_embeddings=131072,
        vocab_size=128256,
        rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE_8B,
        rms_norm_eps=1e-5,
    ),
}

# arch -> (architectures[0], fields only that architecture's config carries)
ARCHS: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaForCausalLM", {"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}),
    "mistral": ("MistralForCausalLM", {"sliding_window": None}),
    # NOTE: Qwen2 always has q/k/v biases; its config has no flag for them
    "qwen2": ("Qwen2ForCausalLM", {"use_sliding_window": False, "sliding_window": None, "max_window_layers": 0}),
    "qwen3": (
        "Qwen3ForCausalLM",
        {"attention_bias": False, "use_sliding_window": False, "sliding_window": None, "max_window_layers": 0},
    ),
}


def get_shape(name: str) -> Shape:
    if name not in SHAPES:
        raise ModelError(f"unknown shape {name!r}; known: {sorted(SHAPES)}")
    return SHAPES[name]


def build_config(
    arch: str,
    shape: Shape,
    *,
    vocab_size: int,
    bos_token_id: int,
    eos_token_id: int,
    dtype: str,
    overrides: dict | None = None,
) -> dict:
    """The config.json dict; `overrides` are applied last, so they win over the shape and the arch."""
    if arch not in ARCHS:
        raise ModelError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}")
    architecture, extras = ARCHS[arch]
    config = {
        "architectures": [architecture],
        "model_type": arch,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "rope_scaling": dict(shape.rope_scaling) if shape.rope_scaling else None,
        "vocab_size": shape.vocab_size or vocab_size,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": dtype,
        **extras,
    }
    config.update(overrides or {})
    return config


def head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def has_qkv_bias(config: dict) -> bool:
    return config["model_type"] == "qwen2" or bool(config.get("attention_bias", False))


def has_o_bias(config: dict) -> bool:
    return config["model_type"] != "qwen2" and bool(config.get("attention_bias", False))


def has_qk_norm(config: dict) -> bool:
    return config["model_type"] == "qwen3"
