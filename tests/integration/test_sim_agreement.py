"""The cluster simulator and a live sim cluster agree: one small trace of requests sharing long prefixes,
replayed through the gateway (`tandem bench serve --trace`) of a real stack of sim workers once per policy,
and through `tandem sim`'s ClusterSim; the policies rank the same and their prefix hit rates match."""

import asyncio
import json
import random
from pathlib import Path

import pytest

from engines.timing.profile import load_profile
from tandem.bench.http_client import Endpoint
from tandem.bench.serve_bench import ServeConfig, run_serve
from tandem.bench.traces import MOONCAKE_BLOCK_SIZE, load_trace
from tandem.cluster.des import ClusterSim, SimConfig
from tandem.cluster.metrics import Slo, summarize
from tests.integration.conftest import all_worker_stats, running_stack

NUM_WORKERS, NUM_GROUPS, NUM_SIBLINGS = 2, 5, 4
NUM_PREFIX_IDS = 14  # 7,168 shared tokens: a miss costs ~160 ms of simulated prefill, a hit ~25 ms
GAP_S = 0.3  # between arrivals: every request is done before the next, so no queueing blurs the ranking
POLICIES = ("kv", "round_robin")
# NOTE: decisions, hence hit rates, are deterministic in both; live, they can differ only where a heartbeat's
# stale load tips a cost. One sibling placed differently moves the rate by <= 14/15/20 = 0.047: allow one.
HIT_RATE_TOLERANCE = NUM_PREFIX_IDS / (NUM_PREFIX_IDS + 1) / (NUM_GROUPS * NUM_SIBLINGS) + 1e-9


def write_trace(path: Path) -> Path:
    """Mooncake rows: NUM_GROUPS prefixes x NUM_SIBLINGS requests, each with one unique last id, in a
    seeded order that does not let round-robin's alternation keep siblings together by chance."""
    order = [g for g in range(NUM_GROUPS) for _ in range(NUM_SIBLINGS)]
    random.Random(3).shuffle(order)
    with open(path, "w") as f:
        for i, group in enumerate(order):
            ids = [group * 100 + j for j in range(NUM_PREFIX_IDS)] + [10_000 + i]
            f.write(
                json.dumps(
                    {
                        "timestamp": int(i * GAP_S * 1000),
                        "input_length": len(ids) * MOONCAKE_BLOCK_SIZE,
                        "output_length": 4,
                        "hash_ids": ids,
                    }
                )
                + "\n"
            )
    return path


def simulated(trace: Path, policy: str) -> dict:
    sim = ClusterSim(load_profile(), SimConfig(NUM_WORKERS), policy)
    return summarize(sim, sim.run(load_trace(trace)), Slo(), 0.0)


def live(model: Path, trace: Path, policy: str, tmp_path: Path) -> dict:
    with running_stack(
        model,
        tmp_path / policy,
        engine="sim",
        num_prefill=0,
        num_decode=NUM_WORKERS,
        worker_args=(),
        router_args=("--policy", policy),
    ) as stack:
        cfg = ServeConfig(Endpoint(stack.url, timeout_s=60), trace=trace)
        summary, _ = asyncio.run(run_serve(cfg))
        stats = all_worker_stats(stack).values()
    assert summary.num_errors == 0, summary.first_errors
    return {
        "ttft_mean_s": summary.ttft_s.mean,
        "prefix_hit_rate": sum(s.prefix_hits for s in stats) / sum(s.prefix_queries for s in stats),
    }


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory) -> Path:
    """Config and tokenizer only (sim workers load no weights), with room for 7.7k-token prompts."""
    from tandem.models.init import init_model

    return init_model(
        tmp_path_factory.mktemp("sim-agree"),
        "llama",
        tiny=True,
        config_only=True,
        overrides={"max_position_embeddings": 8192},
    )


def test_live_sim_cluster_ranks_policies_and_hits_like_the_simulator(long_context_model, tmp_path):
    trace = write_trace(tmp_path / "trace.jsonl")
    sim = {p: simulated(trace, p) for p in POLICIES}
    # the trace must separate the policies, or agreement would prove nothing
    assert sim["kv"]["prefix_hit_rate"] > sim["round_robin"]["prefix_hit_rate"] + 0.2, sim
    assert sim["kv"]["ttft_mean_s"] < 0.75 * sim["round_robin"]["ttft_mean_s"], sim

    got = {p: live(long_context_model, trace, p, tmp_path) for p in POLICIES}
    report = {
        p: {k: (round(sim[p][k], 4), round(got[p][k], 4)) for k in ("prefix_hit_rate", "ttft_mean_s")} for p in POLICIES
    }  # (simulated, live)
    for policy in POLICIES:
        assert abs(got[policy]["prefix_hit_rate"] - sim[policy]["prefix_hit_rate"]) <= HIT_RATE_TOLERANCE, report
    for key in ("prefix_hit_rate", "ttft_mean_s"):
        assert sorted(POLICIES, key=lambda p: sim[p][key]) == sorted(POLICIES, key=lambda p: got[p][key]), report
