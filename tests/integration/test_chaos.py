"""`tandem chaos --short`: every scenario (kills, a stop past the lease, a drain, slow and leaving clients, a
faulty proxy, a router restart, 2x overload, the attack suite beside legitimate load, fuzzing) against real stacks on loopback, in seconds each; it exits
0 only when nothing was lost and every scenario's checks held, and writes its table and JSON."""

import json
import subprocess
import sys

import pytest

SCENARIOS = [
    "proxy-delay",
    "proxy-drop",
    "kill-decode",
    "kill-prefill",
    "drain-decode",
    "stop-worker",
    "slow-client",
    "disconnect-storm",
    "kill-router",
    "kill-router-replica",
    "overload",
    "attacks",
    "fuzz",
]


@pytest.mark.timeout(1200)
def test_every_short_scenario_loses_nothing(tmp_path, smollm2_dir):
    model = smollm2_dir  # its tokenizer: the load's prompts are token ids up to 21,000
    out = tmp_path / "chaos.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tandem.cli",
            "chaos",
            "--short",
            "--scenario",
            "all",
            "--model",
            str(model),
            "--json",
            str(out),
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    doc = json.loads(out.read_text())
    by_name = {s["name"]: s for s in doc["scenarios"]}
    assert list(by_name) == SCENARIOS and doc["passed"] and doc["short"]
    assert all(s["counts"]["lost"] == 0 and s["counts"]["corrupted"] == 0 and s["passed"] for s in by_name.values())
    for name in ("kill-decode", "drain-decode", "proxy-drop"):
        assert by_name[name]["migrated"] >= 1, name
    assert by_name["kill-decode"]["sent"] == by_name["kill-decode"]["counts"]["completed"] > 0
    assert by_name["fuzz"]["facts"]["fuzz_cases"] >= 100 and by_name["fuzz"]["facts"]["fuzz_failures"] == 0
    assert {"429", "503"} <= set(by_name["overload"]["statuses"])
    attacks = by_name["attacks"]["facts"]
    assert attacks["num_attempts"] >= 38 and attacks["num_quiet"] > 0 and attacks["num_attacked"] > 0
    assert "scenario" in run.stdout.splitlines()[0] or "scenario  " in run.stdout
