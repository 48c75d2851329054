"""The SmolLM2 GGUF converted to a Hugging Face checkpoint: layout, config, tokenizer, and that it still answers."""

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem.models import fetch as fetch_mod
from tandem.models.errors import GGUFConversionError
from tandem.models.gguf_convert import hf_name, unpermute_qk

pytestmark = pytest.mark.slow

NON_ASCII = "héllo wörld — 日本語 🙂"


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's HF->GGUF converter does to q/k rows: interleave each head's two halves."""
    half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.arange(3 * 8 * 5, dtype=np.float32).reshape(3 * 8, 5)  # 3 heads, head_dim 8
    permuted = llama_cpp_permute(w, 3)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(unpermute_qk(permuted, 3), w)
    # head 0 in GGUF order is rows 0,4,1,5,2,6,3,7 of the HF layout
    assert permuted[:8, 0].tolist() == [0, 20, 5, 25, 10, 30, 15, 35]


def test_hf_names():
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("blk.12.attn_k.weight") == "model.layers.12.self_attn.k_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    with pytest.raises(GGUFConversionError, match="blk.0.attn_qkv.weight"):
        hf_name("blk.0.attn_qkv.weight")


def test_config_and_weights(converted_smollm2):
    config = json.loads((converted_smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (576, 30, 1536)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (9, 3, 64)
    assert (config["vocab_size"], config["max_position_embeddings"]) == (49152, 8192)
    assert (config["rope_theta"], config["rms_norm_eps"]) == (100000.0, 1e-5)
    assert config["tie_word_embeddings"] is True
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)
    with safe_open(str(converted_smollm2 / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_slice("model.layers.0.self_attn.k_proj.weight").get_shape() == [192, 576]
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"
    assert len(keys) == 2 + 30 * 9 and "lm_head.weight" not in keys


def test_second_fetch_reuses_the_conversion(converted_smollm2, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(fetch_mod, "convert_gguf", fail)
    assert fetch_mod.fetch_model(cache_dir=converted_smollm2.parent) == converted_smollm2


def test_greedy_answer_says_paris(converted_smollm2):
    tok = AutoTokenizer.from_pretrained(converted_smollm2)
    model = AutoModelForCausalLM.from_pretrained(converted_smollm2, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_tokenizer_round_trips_and_splits_digits(converted_smollm2):
    tok = AutoTokenizer.from_pretrained(converted_smollm2)
    ids = tok(NON_ASCII)["input_ids"]
    assert tok.decode(ids) == NON_ASCII
    assert tok.tokenize("2024") == ["2", "0", "2", "4"]  # SmolLM2 splits every digit
    assert tok.tokenize(" the cat") == ["Ġthe", "Ġcat"]


def test_chat_template_and_special_tokens(converted_smollm2):
    tok = AutoTokenizer.from_pretrained(converted_smollm2)
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok("<|im_start|>user")["input_ids"][0] == 1
    assert (tok.eos_token, tok.eos_token_id, tok.bos_token_id, tok.pad_token_id) == ("<|im_end|>", 2, 1, 2)
    assert tok.decode([1, 28120, 2], skip_special_tokens=True) == tok.decode([28120])
