"""The simulator and a live sim worker agree on prefix hit rates by tier: conversations that outgrow a small
device pool, replayed once through a real stack (one sim worker with a host tier) and once through ClusterSim
with the same profile and tier."""

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engines.timing.profile import TimingProfile, load_profile
from tandem.bench.http_client import Endpoint
from tandem.bench.serve_bench import ServeConfig, run_serve
from tandem.bench.traces import MOONCAKE_BLOCK_SIZE, load_trace
from tandem.cluster.des import ClusterSim, SimConfig
from tandem.cluster.metrics import Slo, summarize
from tests.integration.conftest import running_stack

HOST_GB = 4.0
NUM_CONVS, NUM_TURNS = 4, 5
GAP_S = 0.4  # every request done before the next: no queueing, so both runs make the same decisions
# NOTE: live, a heartbeat or a load ending a step later can move a block's hit from one tier to the other:
# allow one 512-token trace block of the run's prompt tokens
TOLERANCE = 1.0 / (NUM_CONVS * NUM_TURNS) + 1e-9


def write_trace(path: Path) -> Path:
    """Turn t of conversation c resends its history (one more 512-token trace block per turn), conversations
    interleaved: together they outgrow a 160-block device pool, each alone never does."""
    with open(path, "w") as f:
        for i, (turn, conv) in enumerate((t, c) for t in range(NUM_TURNS) for c in range(NUM_CONVS)):
            ids = [1000 * (conv + 1) + k for k in range(turn + 3)]
            f.write(
                json.dumps(
                    {
                        "timestamp": int(i * GAP_S * 1000),
                        "input_length": len(ids) * MOONCAKE_BLOCK_SIZE - 64,
                        "output_length": 4,
                        "hash_ids": ids,
                    }
                )
                + "\n"
            )
    return path


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> Path:
    profile = TimingProfile.from_dict({**load_profile().to_dict(), "num_blocks": 160})  # 10k tokens
    path = tmp_path_factory.mktemp("tiers-profile") / "small.json"
    path.write_text(json.dumps(profile.to_dict()))
    return path


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory) -> Path:
    from tandem.models.init import init_model

    return init_model(
        tmp_path_factory.mktemp("sim-tiers"),
        "llama",
        tiny=True,
        config_only=True,
        overrides={"max_position_embeddings": 8192},
    )


def by_tier(metrics_text: str) -> dict[str, float]:
    hits, queries = {}, 0.0
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == "tandem_worker_kv_tier_prefix_hits_total":
                hits[s.labels["tier"]] = s.value
            elif s.name == "tandem_worker_prefix_cache_hits_total":
                hits["all"] = s.value
            elif s.name == "tandem_worker_prefix_cache_queries_total":
                queries = s.value
    hits["device"] = hits.pop("all") - hits["host"] - hits["disk"]
    return {tier: n / queries for tier, n in hits.items()}


def test_live_and_simulated_hit_rates_by_tier_agree(long_context_model, profile_path, tmp_path):
    trace = write_trace(tmp_path / "trace.jsonl")
    sim = ClusterSim(
        TimingProfile.from_dict(json.loads(profile_path.read_text())), SimConfig(1, kv_host_gb=HOST_GB), "kv"
    )
    simulated = summarize(sim, sim.run(load_trace(trace)), Slo(), 0.0)["prefix_hit_rate_by_tier"]
    assert simulated["host"] > 0.2, simulated  # the trace must use the tier, or agreement proves nothing

    with running_stack(
        long_context_model,
        tmp_path / "live",
        engine="sim",
        num_prefill=0,
        num_decode=1,
        worker_args=("--sim-profile", str(profile_path), "--kv-host-gb", str(HOST_GB)),
    ) as stack:
        summary, _ = asyncio.run(run_serve(ServeConfig(Endpoint(stack.url, timeout_s=60), trace=trace)))
        live = by_tier(httpx.get(stack.metrics_urls["decode-0"], timeout=10).text)
    assert summary.num_errors == 0, summary.first_errors
    report = {t: (round(simulated[t], 4), round(live[t], 4)) for t in ("device", "host", "disk")}
    for tier in ("device", "host", "disk"):
        assert abs(live[tier] - simulated[tier]) <= TOLERANCE, report
