"""EngineConfig (what the operator asks for) and ModelConfig (what the checkpoint says). No torch."""

import json
from dataclasses import dataclass, field
from pathlib import Path

from engines.base.engine_configs import BatchConfig, CacheConfig, TransferConfig
from engines.base.errors import ModelNotFoundError, UnsupportedArchitectureError
from engines.core.speculative import SpecConfig, parse_speculative
from engines.transfer import transports

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
DTYPES = ("float32", "bfloat16", "float16")
KV_CACHE_DTYPES = ("auto", "fp8")  # auto: the model dtype; fp8: E4M3 with per-layer scales
ATTENTION_BACKENDS = ("auto", "torch", "triton")  # auto: triton on CUDA, torch elsewhere


@dataclass(frozen=True, slots=True)
class SpeculativeOptions:
    """The native engine's own sub-config, speculative decoding: the proposer, its most tokens per step and what
    verifying them costs (a worker reads each field under its own name: TANDEM_WORKER_SPECULATIVE, ...)."""

    speculative: str = ""  # the proposer: "ngram" (prompt lookup), "draft:DIR" (a model); "": off
    num_speculative_tokens: int = 4  # the most tokens proposed per request and step (adapted down per request)
    # None: measured at start (spec_costs.py); (): the fixed rule (SpecConfig.draft_cost), for greedy and sampled
    spec_verify_costs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        self.spec_config()  # NOTE: a bad method, draft directory or k is one clear ValueError here

    @property
    def method(self) -> str:
        return parse_speculative(self.speculative)[0]

    @property
    def draft_dir(self) -> str:
        return parse_speculative(self.speculative)[1]

    def spec_config(self) -> SpecConfig:
        """The scheduler's half of it (verify costs filled in by the runner once measured)."""
        return SpecConfig(self.method, self.num_speculative_tokens)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str  # a local Hugging Face checkpoint directory
    dtype: str = "float32"  # weights, activations and KV cache
    device: str = "cpu"
    batch: BatchConfig = BatchConfig()  # max_model_len 0: the checkpoint's max_position_embeddings, capped at 8192
    # num_blocks 0: sized from memory; gpu_memory_utilization (CUDA: the card's share this engine may fill, KV = it -
    # used) 0: unused, the pool is kv_cache_memory_fraction of the memory available; the tiers: G2 host, G3 disk
    cache: CacheConfig = CacheConfig(gpu_memory_utilization=0.0)
    # kv_transport: how other engines' KV reaches this cache (transports.ENGINE, never "auto"); held_kv_ttl_s: a
    # hold_kv request's blocks are freed if not exported by then
    transfer: TransferConfig = TransferConfig(transports.BYTES)
    num_threads: int | None = None  # torch intra-op threads; None leaves torch's default
    kv_cache_dtype: str = "auto"
    attention_backend: str = "auto"
    cuda_graphs: bool = True  # decode under CUDA graphs (CUDA with the triton backend only)
    # NOTE: a secret from the worker's signing key, not a knob of the cache: it authenticates disk block headers
    kv_disk_key: bytes = field(default=b"", repr=False)
    speculation: SpeculativeOptions = SpeculativeOptions()  # speculative decoding (off by default)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        if self.transfer.kv_transport not in transports.ENGINE:
            raise ValueError(f"kv_transport must be one of {transports.ENGINE}, got {self.transfer.kv_transport!r}")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str  # "llama" | "mistral" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # qkv bias (Qwen2) or all-projection bias (Llama attention_bias)
    o_proj_bias: bool
    qk_norm: bool  # Qwen3
    rope_scaling: dict | None = None
    sliding_window: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelNotFoundError(f"no config.json in model directory {str(model_dir)!r}")
        return cls.from_dict(json.loads(path.read_text()), Path(model_dir))

    @classmethod
    def from_dict(cls, cfg: dict, model_dir: Path | None = None) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        arch = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise UnsupportedArchitectureError(
                f"unsupported architecture {archs!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        heads = cfg["num_attention_heads"]
        is_qwen2 = arch == "qwen2"
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(cfg),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=is_qwen2 or bool(cfg.get("attention_bias", False)),
            o_proj_bias=(not is_qwen2) and bool(cfg.get("attention_bias", False)),
            qk_norm=arch == "qwen3",
            rope_scaling=_rope_scaling(cfg),
            sliding_window=_sliding_window(cfg, arch),
            eos_token_ids=_eos_ids(cfg, model_dir),
        )


def _rope_theta(cfg: dict) -> float:
    params = cfg.get("rope_parameters") or {}
    return float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)


def _rope_scaling(cfg: dict) -> dict | None:
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return None
    if kind != "llama3":
        raise UnsupportedArchitectureError(f"unsupported rope scaling {kind!r}; supported: llama3")
    return dict(scaling)


def _sliding_window(cfg: dict, arch: str) -> int | None:
    window = cfg.get("sliding_window")
    if arch in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        return None
    return int(window) if window else None


def _eos_ids(cfg: dict, model_dir: Path | None) -> tuple[int, ...]:
    ids: list[int] = []
    sources = [cfg]
    if model_dir is not None and (model_dir / "generation_config.json").is_file():
        sources.append(json.loads((model_dir / "generation_config.json").read_text()))
    for src in sources:
        eos = src.get("eos_token_id")
        for tok in eos if isinstance(eos, list) else [eos]:
            if isinstance(tok, int) and tok not in ids:
                ids.append(tok)
    return tuple(ids)
