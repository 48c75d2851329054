"""On a host without TensorRT-LLM, a trtllm worker says so in one line and exits 2 at once (no traceback), as
`tandem serve` and under `tandem up`; real processes, nothing mocked. Skips where tensorrt_llm is installed."""

import importlib.util
import os
import subprocess
import sys
import time

import pytest

from engines.trtllm.config import TRTLLM_VERSION
from tandem.launcher import free_port

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorrt_llm") is not None,
    reason="tensorrt_llm is installed here: the engine starts instead",
)
WHAT_AND_HOW = (
    "tensorrt_llm package, which is not installed",
    f"nvcr.io/nvidia/tensorrt-llm/release:{TRTLLM_VERSION}",
    f"pip install tensorrt-llm=={TRTLLM_VERSION}",
)


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_serve_says_what_is_missing_in_one_line_and_exits_2(tiny_stack_model, role):
    start = time.monotonic()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tandem.cli",
            "serve",
            role,
            "--engine",
            "trtllm",
            "--device",
            "cuda",
            "--model",
            str(tiny_stack_model),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(),
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tandem serve {role}: error: engine trtllm needs"), out.stderr
    assert all(part in lines[0] for part in WHAT_AND_HOW) and "Traceback" not in out.stderr + out.stdout
    assert time.monotonic() - start < 60  # at once: no model load, no server


def test_the_missing_package_comes_first_even_with_the_default_device(tiny_stack_model):
    out = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "serve", "decode", "--engine", "trtllm"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env(), "TANDEM_MODEL": str(tiny_stack_model)},
    )
    assert out.returncode == 2 and all(part in out.stderr for part in WHAT_AND_HOW), out.stderr


def test_up_with_engine_trtllm_stops_at_the_engines_import_and_shows_why(tiny_stack_model, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tandem.cli",
            "up",
            "--engine",
            "trtllm",
            "--model",
            str(tiny_stack_model),
            "--prefill",
            "0",
            "--decode",
            "1",
            "--port",
            str(free_port()),
            "--num-threads",
            "1",
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**env(), "TANDEM_WORKER_DEVICE": "cuda"},
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "tandem up failed: decode-0 exited with code 2" in out.stderr, out.stderr
    assert all(part in out.stderr for part in WHAT_AND_HOW), out.stderr
