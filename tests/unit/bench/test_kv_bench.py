"""`tandem bench kv` end to end at a small size: a real prefill worker process, both transports, table + JSON."""

import json
import subprocess
import sys

import pytest

from engines.transfer.nixl_link import is_available


@pytest.mark.skipif(not is_available(), reason="NIXL is not installed")
def test_bench_kv_moves_every_request_by_both_transports_and_writes_json(tmp_path):
    out = tmp_path / "kv.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tandem.cli",
            "bench",
            "kv",
            "--tokens",
            "200",
            "--num-requests",
            "2",
            "--cache-mb",
            "64",
            "--kv-bytes-per-token",
            "8192",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith(("transport", "nixl", "grpc"))]
    assert [line.split()[:2] for line in lines] == [["transport", "signed"], ["nixl", "yes"], ["grpc", "yes"]]
    report = json.loads(out.read_text())
    assert report["target_gb_per_s"] == 2.0
    results = {r["transport"]: r for r in report["results"]}
    for r in results.values():  # 200 tokens: 4 blocks of 64 tokens x 8192 bytes per token
        assert (r["num_requests"], r["bytes_per_request"]) == (2, 4 * 64 * 8192) and r["gb_per_s"] > 0


def test_signed_over_unsigned_is_computed_per_transport_measured_both_ways():
    from tandem.bench.kv_bench import KvResult, signed_ratios

    results = [
        KvResult("nixl", False, 1, 1, 0.1, 4.0),
        KvResult("nixl", True, 1, 1, 0.1, 3.9),
        KvResult("grpc", True, 1, 1, 0.1, 1.0),
        KvResult("nixl", False, 1, 1, 0.1, 2.0),
        KvResult("nixl", True, 1, 1, 0.1, 2.1),
    ]
    assert signed_ratios(results) == {"nixl": pytest.approx(3.0 / 3.0)}  # means; grpc ran signed only: no anchor
