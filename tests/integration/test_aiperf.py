"""NVIDIA's aiperf, from its own venv (`make aiperf`), against a zero-engine stack: a third-party client must
stream /v1/chat/completions without one error. Fails, never skips, when that venv is missing."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import running_stack

REPO = Path(__file__).resolve().parents[2]
AIPERF = REPO / ".venv-aiperf" / "bin" / "aiperf"
NUM_REQUESTS = 8


@pytest.fixture(scope="module")
def aiperf() -> Path:
    if not AIPERF.is_file():
        pytest.fail(f"{AIPERF} not found: run `make aiperf` to install aiperf into .venv-aiperf")
    return AIPERF


def test_aiperf_chat_streaming_has_no_errors(aiperf, tiny_stack_model, tmp_path):
    artifacts = tmp_path / "aiperf"
    with running_stack(tiny_stack_model, tmp_path, engine="zero", num_prefill=0) as stack:
        cmd = [
            str(aiperf),
            "profile",
            "--model",
            tiny_stack_model.name,
            "--url",
            stack.url,
            "--endpoint-type",
            "chat",
            "--streaming",
            "--tokenizer",
            str(tiny_stack_model),
            "--concurrency",
            "2",
            "--request-count",
            str(NUM_REQUESTS),
            "--prompt-input-tokens-mean",
            "32",
            "--prompt-input-tokens-stddev",
            "0",
            "--prompt-output-tokens-mean",
            "16",
            "--prompt-output-tokens-stddev",
            "0",
            "--output-artifact-dir",
            str(artifacts),
            "--no-auto-plot",
        ]
        # NOTE: HF_HUB_OFFLINE (set for the tests) is left out: aiperf reads the local tokenizer folder as is
        env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
        run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    export = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    assert export["request_count"]["avg"] == NUM_REQUESTS
    assert export["completed_request_count"]["avg"] == NUM_REQUESTS
    assert not export.get("error_request_count") and export["error_summary"] == []
    assert export["request_error_rate"]["avg"] == 0.0
    assert export["output_sequence_length"]["avg"] == 16  # the zero engine honours max tokens exactly
    assert export["time_to_first_token"]["count"] == NUM_REQUESTS
