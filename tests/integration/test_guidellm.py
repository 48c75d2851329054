"""guidellm (the vLLM project's benchmark client), from its own venv (`make guidellm`), against a live stack with a
prefill and a decode worker: a fixed-length synthetic run at concurrency 4 ends with every request completed and
none failed (guidellm streams with stream_options.continuous_usage_stats). Fails, never skips, when the venv is
missing."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import running_stack

REPO = Path(__file__).resolve().parents[2]
GUIDELLM = REPO / ".venv-guidellm" / "bin" / "guidellm"
NUM_REQUESTS = 12
OUTPUT_TOKENS = 16


@pytest.fixture(scope="module")
def guidellm() -> Path:
    if not GUIDELLM.is_file():
        pytest.fail(f"{GUIDELLM} not found: run `make guidellm` to install guidellm into .venv-guidellm")
    return GUIDELLM


def scenario(url: str, model: Path, path: Path) -> Path:
    path.write_text(
        json.dumps(
            {
                "spec": {
                    "backend": {
                        "kind": "openai_http",
                        "target": url,
                        "model": model.name,
                        "request_format": "/v1/chat/completions",
                    },
                    "profile": {"kind": "concurrent", "streams": 4},
                    "tokenizer": {"kind": "hf_auto", "model": str(model)},
                    "data": [{"kind": "synthetic_text", "prompt_tokens": 32, "output_tokens": OUTPUT_TOKENS}],
                    "constraints": [{"kind": "max_requests", "count": NUM_REQUESTS}],
                }
            }
        )
    )
    return path


def test_guidellm_synthetic_run_has_no_errors(guidellm, tiny_stack_model, tmp_path):
    report = tmp_path / "guidellm.json"
    with running_stack(tiny_stack_model, tmp_path, engine="zero", num_prefill=1) as stack:
        cmd = [
            str(guidellm),
            "run",
            "--scenario",
            str(scenario(stack.url, tiny_stack_model, tmp_path / "s.json")),
            "--output",
            f"kind=json,path={report}",
            "--disable-console-interactive",
        ]
        env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"} | {"HF_HUB_OFFLINE": "1"}
        run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    totals = benchmark["scheduler_metrics"]["requests_made"]
    assert totals["successful"] == NUM_REQUESTS and totals["errored"] == 0 and totals["incomplete"] == 0
