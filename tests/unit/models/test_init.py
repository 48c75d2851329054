"""Random-weight checkpoints: every arch loads in transformers, weights follow the config, output is reproducible."""

import json
import statistics

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem.models import init as init_mod
from tandem.models.errors import ModelError
from tandem.models.init import init_model
from tests.conftest import TINY_VARIANTS

ARCH_CLASSES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
PROMPTS = ["Hello! How can I help you today?", "The capital of France is", "def add(a, b):", "Once upon a time"]


def weight_keys(model_dir) -> dict[str, list[int]]:
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return {k: f.get_slice(k).get_shape() for k in f.keys()}


def load(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
def test_every_variant_loads_and_generates(tiny_model_factory, variant):
    model_dir = tiny_model_factory(variant)
    model = load(model_dir)
    assert type(model).__name__ == ARCH_CLASSES[TINY_VARIANTS[variant][0]]
    prompt = AutoTokenizer.from_pretrained(model_dir)(PROMPTS[0], return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert out.shape == (1, prompt.shape[1] + 8)


def test_tiny_config_fields(tiny_model_factory):
    for arch, cls in ARCH_CLASSES.items():
        config = json.loads((tiny_model_factory(arch) / "config.json").read_text())
        assert (config["architectures"], config["model_type"]) == ([cls], arch)
        shape = [
            config[k]
            for k in (
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "intermediate_size",
            )
        ]
        assert shape == [64, 2, 4, 2, 16, 128]
        assert (config["vocab_size"], config["max_position_embeddings"]) == (512, 512)
        assert (config["bos_token_id"], config["eos_token_id"], config["tie_word_embeddings"]) == (0, 2, False)
        gen = json.loads((tiny_model_factory(arch) / "generation_config.json").read_text())
        assert gen["eos_token_id"] == [2, 0]


def test_weights_follow_the_config(tiny_model_factory):
    assert "lm_head.weight" in weight_keys(tiny_model_factory("llama"))
    assert "lm_head.weight" not in weight_keys(tiny_model_factory("llama-tied"))
    assert weight_keys(tiny_model_factory("llama-mqa"))["model.layers.0.self_attn.k_proj.weight"] == [16, 64]
    assert weight_keys(tiny_model_factory("llama-mha"))["model.layers.1.self_attn.v_proj.weight"] == [64, 64]
    qwen2 = weight_keys(tiny_model_factory("qwen2"))
    assert qwen2["model.layers.0.self_attn.k_proj.bias"] == [32]
    assert "model.layers.0.self_attn.o_proj.bias" not in qwen2
    qwen3 = weight_keys(tiny_model_factory("qwen3"))
    assert qwen3["model.layers.1.self_attn.q_norm.weight"] == [16]
    assert not any(k.endswith(".bias") for k in qwen3)


def test_overrides_change_layers_and_head_dim(tmp_path):
    init_model(tmp_path, "qwen3", overrides={"num_hidden_layers": 3, "head_dim": 8})
    keys = weight_keys(tmp_path)
    assert keys["model.layers.2.self_attn.q_proj.weight"] == [32, 64]
    assert keys["model.layers.2.self_attn.k_norm.weight"] == [8]
    assert "model.layers.3.input_layernorm.weight" not in keys
    assert load(tmp_path).config.num_hidden_layers == 3


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a, b, c = (init_model(tmp_path / n, "qwen2", seed=s) for n, s in (("a", 7), ("b", 7), ("c", 8)))
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()


def test_greedy_logits_have_clear_margins(tiny_model_factory):
    for variant in ("llama", "llama-tied", "qwen2", "qwen3"):
        model_dir = tiny_model_factory(variant)
        model, tok = load(model_dir), AutoTokenizer.from_pretrained(model_dir)
        gaps = []
        for prompt in PROMPTS:
            with torch.inference_mode():
                logits = model(tok(prompt, return_tensors="pt")["input_ids"]).logits[0]
            top2 = logits.topk(2, dim=-1).values  # [num_tokens, 2]
            gaps += (top2[:, 0] - top2[:, 1]).tolist()
        assert statistics.median(gaps) > 0.1, variant


def test_tokenizer_round_trip_and_chat_template(tiny_llama):
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    text = "héllo wörld — 日本語 🙂"
    assert tok.decode(tok(text)["input_ids"]) == text
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok(rendered)["input_ids"]
    assert (ids[0], ids.count(1), ids.count(2)) == (1, 3, 2)  # <|im_start|>=1, <|im_end|>=2 stay whole
    assert (tok.eos_token_id, tok.pad_token_id, len(tok)) == (2, 0, 512)


def test_sharded_bf16_weights_load(tmp_path, monkeypatch):
    monkeypatch.setattr(init_mod, "MAX_SINGLE_FILE_BYTES", 0)
    init_model(tmp_path, "llama", dtype="bfloat16")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == [f"model-0000{i}-of-00004.safetensors" for i in (1, 2, 3, 4)]  # embed, 2 layers, head
    assert index["weight_map"]["model.layers.1.mlp.up_proj.weight"] == "model-00003-of-00004.safetensors"
    assert not (tmp_path / "model.safetensors").exists()
    assert load(tmp_path).model.layers[1].mlp.up_proj.weight.shape == (128, 64)


def test_llama_8b_shape_config_only(tmp_path):
    init_model(tmp_path, "llama", shape="llama-3.1-8b", dtype="bfloat16", config_only=True)
    config = json.loads((tmp_path / "config.json").read_text())
    dims = [
        config[k]
        for k in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        )
    ]
    assert dims == [4096, 32, 32, 8, 14336, 128256, 131072]
    assert (config["rope_theta"], config["rope_scaling"]["rope_type"], config["rope_scaling"]["factor"]) == (
        500000.0,
        "llama3",
        8.0,
    )
    assert config["torch_dtype"] == "bfloat16"
    assert not list(tmp_path.glob("*.safetensors"))


def test_every_id_of_a_big_vocabulary_decodes_to_visible_text(tmp_path):
    """A random 8B-shaped model samples any of 128,256 ids: each must stream as text, not as ""."""
    from tokenizers import Tokenizer

    init_model(tmp_path, "llama", shape="llama-3.1-8b", config_only=True)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 128256
    texts = tok.decode_batch([[i] for i in range(128256)], skip_special_tokens=False)
    assert all(texts)
    fillers = texts[512:]
    assert all(t[0] == " " and t[1:].isalpha() and t[1:].islower() for t in fillers)
    assert len(set(fillers)) == len(fillers)
    tiny = Tokenizer.from_file(str(init_model(tmp_path / "tiny", "llama") / "tokenizer.json"))
    assert tok.encode(PROMPTS[1]).ids == tiny.encode(PROMPTS[1]).ids  # encoding never makes a filler


def test_bad_arguments_raise(tmp_path):
    with pytest.raises(ModelError, match="unknown arch 'gpt2'"):
        init_model(tmp_path, "gpt2")
    with pytest.raises(ModelError, match="unknown shape 'huge'"):
        init_model(tmp_path, "llama", shape="huge")
    with pytest.raises(ModelError, match="dtype must be one of"):
        init_model(tmp_path, "llama", dtype="int8")
