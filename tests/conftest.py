"""Shared fixtures: tiny random checkpoints per architecture, the real SmolLM2, one torch thread."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("TANDEM_OFFLINE", "1")  # tests never download
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

# name -> (arch, config overrides): every architecture flag the native engine supports
TINY_VARIANTS = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama-mqa": ("llama", {"num_key_value_heads": 1}),
    "llama-mha": ("llama", {"num_key_value_heads": 4}),
    "llama3-rope": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "mistral": ("mistral", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
}


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    from tandem.models.init import init_model

    made: dict[str, Path] = {}

    def make(variant: str = "llama") -> Path:
        if variant not in made:
            arch, overrides = TINY_VARIANTS[variant]
            out = tmp_path_factory.mktemp(f"tiny-{variant}")
            made[variant] = init_model(out, arch, tiny=True, seed=0, overrides=overrides)
        return made[variant]

    return make


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory) -> Path:
    return tiny_model_factory("llama")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real default model, converted once into the cache by `tandem model fetch`."""
    from tandem.models.fetch import fetch_model

    return fetch_model()
