"""Convert a llama-architecture GGUF file (e.g. SmolLM2's Q4_1) into a bf16 Hugging Face checkpoint directory.

Dequantizes with the `gguf` package, undoes llama.cpp's q/k row permutation, writes atomically.
"""

import logging
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file
from tqdm import tqdm

from tandem.models import hf_files
from tandem.models.errors import GGUFConversionError
from tandem.models.gguf_tokenizer import build_tokenizer, field

logger = logging.getLogger(__name__)

# Bump when the output format changes, so cached conversions are redone.
CONVERTER_VERSION = 1

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# rope_freqs holds llama3 rope scaling factors, which HF recomputes from config.rope_scaling
_SKIPPED = frozenset({"rope_freqs.weight"})


def convert_gguf(gguf_path: Path, out_dir: Path, *, replace: bool = False) -> Path:
    """Write config.json, model.safetensors, tokenizer and generation config for `gguf_path` into `out_dir`."""
    reader = GGUFReader(str(gguf_path))
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise GGUFConversionError(f"unsupported GGUF architecture {arch!r}; supported: 'llama'")
    tok = build_tokenizer(reader)
    tensors = _convert_tensors(reader)
    config = build_config(reader, tok.special_ids, is_tied="lm_head.weight" not in tensors)
    marker = {"converter_version": CONVERTER_VERSION, "source": Path(gguf_path).name}
    with hf_files.staged_dir(Path(out_dir), marker, replace=replace) as staging:
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        hf_files.write_json(staging / "config.json", config)
        hf_files.write_json(staging / "generation_config.json", _generation_config(tok.special_ids))
        hf_files.write_tokenizer_files(
            staging,
            tok.tokenizer,
            chat_template=tok.chat_template,
            special=tok.special,
            model_max_length=config["max_position_embeddings"],
        )
    logger.info("converted %s (%d tensors) into %s", gguf_path, len(tensors), out_dir)
    return Path(out_dir)


def build_config(reader: GGUFReader, special_ids: dict[str, int | None], *, is_tied: bool) -> dict:
    """config.json for LlamaForCausalLM from the `llama.*` metadata keys."""
    hidden = _required(reader, "llama.embedding_length")
    heads = _required(reader, "llama.attention.head_count")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": _required(reader, "llama.feed_forward_length"),
        "num_hidden_layers": _required(reader, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": field(reader, "llama.attention.head_count_kv", heads),
        "head_dim": field(reader, "llama.attention.key_length")
        or field(reader, "llama.rope.dimension_count")
        or hidden // heads,
        "max_position_embeddings": _required(reader, "llama.context_length"),
        "rms_norm_eps": _f32(field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": _f32(field(reader, "llama.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "vocab_size": field(reader, "llama.vocab_size") or len(field(reader, "tokenizer.ggml.tokens")),
        "tie_word_embeddings": is_tied,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
        **special_ids,
    }


def _f32(value: float) -> float:
    # GGUF stores float32: 1e-5 reads back as 9.99999975e-06. The shortest decimal that rounds to the same
    # float32 is the value the original config.json held.
    return float(str(np.float32(value)))


def _required(reader: GGUFReader, key: str):
    value = field(reader, key)
    if value is None:
        raise GGUFConversionError(f"GGUF metadata lacks {key!r}")
    return value


def _generation_config(special_ids: dict[str, int | None]) -> dict:
    return {k: v for k, v in special_ids.items() if v is not None}


def _convert_tensors(reader: GGUFReader) -> dict[str, torch.Tensor]:
    heads = _required(reader, "llama.attention.head_count")
    kv_heads = field(reader, "llama.attention.head_count_kv", heads)
    out: dict[str, torch.Tensor] = {}
    for t in tqdm(reader.tensors, desc="converting GGUF tensors", unit="tensor"):
        if t.name in _SKIPPED:
            continue
        name = hf_name(t.name)
        weight = _dequantized(t)
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            weight = unpermute_qk(weight, heads if "q_proj" in name else kv_heads)
        out[name] = torch.from_numpy(weight).to(torch.bfloat16)
    return out


def hf_name(gguf_name: str) -> str:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; raises on names it does not know."""
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    raise GGUFConversionError(f"unknown GGUF tensor {gguf_name!r}")


def _dequantized(t) -> np.ndarray:
    # NOTE: GGUF lists dims fastest-first (ne0 = columns), so the torch/HF shape is the reverse
    expected = tuple(int(d) for d in reversed(t.shape))
    # np.array copies: F32 tensors come back as read-only views of the memory-mapped file
    weight = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)
    if weight.size != int(np.prod(expected)):
        raise GGUFConversionError(f"{t.name}: {weight.size} values, expected shape {expected}")
    return weight.reshape(expected)


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's export permutation of q_proj/k_proj rows.

    HF rotates pairs (i, i + head_dim/2) within a head (rotate_half); llama.cpp's rope wants pairs
    (2i, 2i+1), so its converter interleaves each head's rows ([2, half] -> [half, 2]). We reverse that.
    """
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise GGUFConversionError(f"{rows} q/k rows do not split into {num_heads} heads of even size")
    half = rows // num_heads // 2
    # [num_heads, half, 2, in] -> [num_heads, 2, half, in]
    w = weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2)
    return np.ascontiguousarray(w).reshape(weight.shape)
