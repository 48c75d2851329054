"""Every service turns a bad setting into one line on stderr and exit code 2 (no traceback)."""

import os
import subprocess
import sys

import pytest

CASES = [
    (["decode"], "a model directory is required"),  # no --model and no TANDEM_MODEL
    (["prefill", "--model", "m", "--overlap", "sometimes"], "overlap must be one of"),
    (["decode", "--model", "m", "--engine", "gpu"], "engine must be one of"),
    (["router", "--policy", "nearest"], "policy"),
    (["gateway"], "model is required"),
    (["decode", "--model", "m", "--kv-disk-gb", "5"], "needs both a directory"),
    (["decode", "--model", "m", "--kv-host-gb", "-1"], "must be >= 0"),
    (["decode", "--model", "m", "--kv-disk-dir", "/tmp/kv", "--kv-disk-gb", "5"], "fed from the host tier"),
    (["decode", "--model", "m", "--engine", "trtllm", "--kv-host-gb", "1"], "keeps its own KV tiers"),
]


@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_setting_is_one_line_and_exit_code_2(args, message):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "serve", *args], capture_output=True, text=True, env=env, timeout=60
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_a_host_tier_larger_than_the_machine_is_refused_at_start(tiny_llama):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "serve", "decode", "--model", str(tiny_llama), "--kv-host-gb", "1000000"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "host KV tier asks for 1000000.0 GB" in last and "lower TANDEM_WORKER_KV_HOST_GB" in last, proc.stderr
    assert "Traceback" not in proc.stderr
