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
]


@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_setting_is_one_line_and_exit_code_2(args, message):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    proc = subprocess.run([sys.executable, "-m", "tandem.cli", "serve", *args], capture_output=True, text=True,
                          env=env, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr, proc.stderr
